-- Checks a JSON value against a JSON Schema of the specs' type language: type (a name or a list;
-- "integer" is a whole number), properties, required, items, enum, const, anyOf,
-- additionalProperties, and $ref into the root schema's $defs; other keywords (description) are
-- ignored. Returns the first violation as "<path>: <what is wrong>" (the path as $.a.b[2]), or
-- null when the value matches. Pure. send_signal checks a signal's payload with it.
create function pgflow.schema_violation(value jsonb, schema jsonb, root jsonb default null, path text default '$')
returns text
language plpgsql
immutable
parallel safe
set search_path = ''
as $$
declare
  v_root jsonb := coalesce(root, schema);
  v_actual text := jsonb_typeof(value);
  v_wanted text[];
  v_key text;
  v_child jsonb;
  v_problem text;
  v_first text;
  v_index int;
begin
  if schema is null or jsonb_typeof(schema) <> 'object' then
    return null;  -- no schema: any JSON value
  end if;
  if schema ? '$ref' then
    v_child := v_root #> array['$defs', substr(schema ->> '$ref', length('#/$defs/') + 1)];
    if v_child is null then
      return format('%s: the schema refers to %s, which its $defs do not define', path, schema ->> '$ref');
    end if;
    return pgflow.schema_violation(value, v_child, v_root, path);
  end if;

  if schema ? 'type' then
    v_wanted := case jsonb_typeof(schema -> 'type')
      when 'array' then array(select jsonb_array_elements_text(schema -> 'type'))
      else array[schema ->> 'type'] end;
    if not (v_actual = any (v_wanted)
      or ('integer' = any (v_wanted) and v_actual = 'number' and value::numeric % 1 = 0)) then
      return format('%s: expected %s, got %s', path, array_to_string(v_wanted, ' or '),
        case when v_actual = 'number' and 'integer' = any (v_wanted) then 'a fraction' else v_actual end);
    end if;
  end if;
  if schema ? 'enum' and not exists (
    select 1 from jsonb_array_elements(schema -> 'enum') as e where e.value = schema_violation.value
  ) then
    return format('%s: %s is not one of %s', path, left(value::text, 60), left((schema -> 'enum')::text, 200));
  end if;
  if schema ? 'const' and schema -> 'const' <> value then
    return format('%s: expected %s, got %s', path, left((schema -> 'const')::text, 60), left(value::text, 60));
  end if;
  if jsonb_typeof(schema -> 'anyOf') = 'array' then
    v_first := null;
    for v_child in select e.value from jsonb_array_elements(schema -> 'anyOf') as e loop
      v_problem := pgflow.schema_violation(value, v_child, v_root, path);
      if v_problem is null then
        v_first := null;
        exit;
      end if;
      v_first := coalesce(v_first, v_problem);
    end loop;
    if v_first is not null then
      return format('%s: matches none of its %s choices (the first: %s)',
        path, jsonb_array_length(schema -> 'anyOf'), v_first);
    end if;
  end if;

  if v_actual = 'object' then
    for v_key in select jsonb_array_elements_text(coalesce(schema -> 'required', '[]')) loop
      if not value ? v_key then
        return format('%s: "%s" is required', path, v_key);
      end if;
    end loop;
    for v_key, v_child in select e.key, e.value from jsonb_each(value) as e order by e.key loop
      if schema -> 'properties' ? v_key then
        v_problem := pgflow.schema_violation(v_child, schema -> 'properties' -> v_key, v_root,
          path || case when v_key ~ '^[A-Za-z_][A-Za-z0-9_]*$' then '.' || v_key
            else '[' || to_jsonb(v_key)::text || ']' end);
      elsif schema -> 'additionalProperties' = 'false'::jsonb then
        v_problem := format('%s: "%s" is not a property it allows', path, v_key);
      elsif jsonb_typeof(schema -> 'additionalProperties') = 'object' then
        v_problem := pgflow.schema_violation(v_child, schema -> 'additionalProperties', v_root,
          path || '[' || to_jsonb(v_key)::text || ']');
      end if;
      if v_problem is not null then
        return v_problem;
      end if;
    end loop;
  elsif v_actual = 'array' and jsonb_typeof(schema -> 'items') = 'object' then
    v_index := 0;
    for v_child in select e.value from jsonb_array_elements(value) as e loop
      v_problem := pgflow.schema_violation(v_child, schema -> 'items', v_root, format('%s[%s]', path, v_index));
      if v_problem is not null then
        return v_problem;
      end if;
      v_index := v_index + 1;
    end loop;
  end if;
  return null;
end;
$$;

-- Rejects a malformed shape document with a clear error before anything is compared or written.
-- Called by ensure_flow_compiled.
create function pgflow._validate_flow_shape(shape jsonb)
returns void
language plpgsql
immutable
set search_path = ''
as $$
declare
  v_step jsonb;
  v_index int := 0;
  v_duplicate text;
  v_option record;
begin
  if jsonb_typeof(shape) is distinct from 'object' or jsonb_typeof(shape -> 'steps') is distinct from 'array' then
    raise exception 'Invalid flow shape: expected an object with a "steps" array.'
      using errcode = '22023', detail = left(coalesce(shape::text, 'NULL'), 200);
  end if;
  for v_step in select value from jsonb_array_elements(shape -> 'steps') loop
    if jsonb_typeof(v_step) is distinct from 'object' or jsonb_typeof(v_step -> 'slug') is distinct from 'string' then
      raise exception 'Invalid flow shape: step at index % has no string "slug".', v_index
        using errcode = '22023', detail = left(v_step::text, 200);
    end if;
    if v_step ? 'dependencies' and jsonb_typeof(v_step -> 'dependencies') <> 'array' then
      raise exception 'Invalid flow shape: "dependencies" of step "%" is not an array.', v_step ->> 'slug'
        using errcode = '22023';
    end if;
    if v_step ? 'payloadSchema' and (jsonb_typeof(v_step -> 'payloadSchema') is distinct from 'object'
      or v_step ->> 'stepType' is distinct from 'signal') then
      raise exception 'Invalid flow shape: "payloadSchema" of step "%" must be a JSON Schema object of a signal step.',
        v_step ->> 'slug'
        using errcode = '22023';
    end if;
    if v_step ? 'subflowSlug' and (jsonb_typeof(v_step -> 'subflowSlug') is distinct from 'string'
      or coalesce(v_step ->> 'stepType', 'single') not in ('subflow', 'map')) then
      raise exception 'Invalid flow shape: "subflowSlug" of step "%" must be the slug of a flow, on a subflow or map step.',
        v_step ->> 'slug'
        using errcode = '22023';
    end if;
    v_index := v_index + 1;
  end loop;

  select s.value ->> 'slug' into v_duplicate
  from jsonb_array_elements(shape -> 'steps') as s
  group by s.value ->> 'slug' having count(*) > 1
  limit 1;
  if v_duplicate is not null then
    raise exception 'Invalid flow shape: step "%" appears more than once.', v_duplicate
      using errcode = '22023';
  end if;

  if shape ? 'inputSchema' and jsonb_typeof(shape -> 'inputSchema') is distinct from 'object' then
    raise exception 'Invalid flow shape: "inputSchema" must be a JSON Schema object, got %.',
      jsonb_typeof(shape -> 'inputSchema')
      using errcode = '22023';
  end if;

  -- Options must be whole numbers (flow options, then each step's), but for a step's
  -- concurrency key, a JSON path (engine 0018).
  for v_option in
    select o.key, o.value from jsonb_each(coalesce(shape -> 'options', '{}')) as o
    union all
    select o.key, o.value
    from jsonb_array_elements(shape -> 'steps') as s, jsonb_each(coalesce(s.value -> 'options', '{}')) as o
  loop
    if v_option.key = 'concurrencyKey' and jsonb_typeof(v_option.value) = 'string' then
      begin
        perform (v_option.value #>> '{}')::jsonpath;
      exception when syntax_error then
        raise exception 'Invalid flow shape: option "concurrencyKey" must be a JSON path into the run''s input, such as "$.tenant_id", got %.',
          v_option.value
          using errcode = '22023';
      end;
    elsif jsonb_typeof(v_option.value) <> 'number' or v_option.value::text !~ '^-?[0-9]+$' then
      raise exception 'Invalid flow shape: option "%" must be a whole number, got %.', v_option.key, v_option.value
        using errcode = '22023';
    end if;
  end loop;
end;
$$;

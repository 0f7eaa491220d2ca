-- One table trigger of flow_slug as pgflow.set_flow_triggers is given it, checked against the
-- database and the flow's input schema, as the pgflow.flow_triggers row to keep (engine 0032).
-- A trigger is {"name", "table", "on", "when", "input", "onError"}:
-- - name: a letter, then letters, digits or _ (at most 40); unique in the flow;
-- - table: an existing table, schema-qualified, on which the caller (the session's login role)
--   has the TRIGGER privilege, and whose owner the engine's owner is or is a member of (or it
--   could create the trigger but never drop it);
-- - on: ["insert"] (the default), ["update"] or both;
-- - when (default {}): {column: {operator: value}}, every test must hold: eq, ne, gt, gte, lt, lte
--   (a JSON scalar, read as the column's type), in (a list of them), is_null (true or false), and
--   changed (true or false; only for a trigger on update alone): the database trigger tests it;
-- - input: {input key: column}: the run input, every required key of the flow's input schema
--   mapped, and each column's type fitting its key's JSON type (pgflow._column_fits_json);
-- - onError: raise (the default) or skip.
-- Every refusal names the flow and the trigger, and where in it: 22023 for a malformed trigger,
-- 42P01 for a missing table, 42703 for a missing column, 42804 for a type that does not fit, 42501
-- without the privileges. No writes.
create function pgflow._checked_trigger(flow_slug text, trigger jsonb, input_schema jsonb)
returns pgflow.flow_triggers
language plpgsql
stable
set search_path = ''
as $$
declare
  v_row pgflow.flow_triggers;
  v_where text;
  v_key text;
  v_relid oid;
  v_events jsonb := coalesce(trigger -> 'on', '["insert"]');
  v_when jsonb := coalesce(trigger -> 'when', '{}');
  v_on_error text := coalesce(trigger ->> 'onError', 'raise');
  v_item record;
  v_test record;
  v_type oid;
  v_tests text[] := '{}';
  v_operator text;
  v_owner text;
  v_parts int;
begin
  if jsonb_typeof(trigger) is distinct from 'object' then
    raise exception 'Flow "%": each of its triggers must be a JSON object, got %.', flow_slug,
      coalesce(jsonb_typeof(trigger), 'NULL') using errcode = '22023';
  end if;
  if coalesce(trigger ->> 'name', '') !~ '^[A-Za-z][A-Za-z0-9_]{0,39}$' then
    raise exception 'Flow "%": a trigger''s name must be a letter, then letters, digits or _ (at most 40 in all), got %.',
      flow_slug, coalesce((trigger -> 'name')::text, 'none') using errcode = '22023';
  end if;
  v_where := format('Flow "%s" trigger "%s"', flow_slug, trigger ->> 'name');
  select k into v_key from jsonb_object_keys(trigger) as k
  where k not in ('name', 'table', 'on', 'when', 'input', 'onError') order by k limit 1;
  if found then
    raise exception '%: unknown key "%".', v_where, v_key
      using errcode = '22023', hint = 'A trigger has name, table, on, when, input and onError.';
  end if;

  -- table: an existing table (schema-qualified: this runs with an empty search path), which
  -- the caller may put triggers on and the engine's owner may drop them from.
  if jsonb_typeof(trigger -> 'table') is distinct from 'string' then
    raise exception '%: "table" must name a table, got %.', v_where,
      coalesce((trigger -> 'table')::text, 'nothing') using errcode = '22023';
  end if;
  begin
    v_parts := cardinality(pg_catalog.parse_ident(trigger ->> 'table'));
  exception when invalid_name or syntax_error or invalid_parameter_value then
    v_parts := null;
  end;
  if v_parts is distinct from 2 then
    raise exception '%: table % must be given as schema.table.', v_where, trigger ->> 'table'
      using errcode = '22023';
  end if;
  v_relid := to_regclass(trigger ->> 'table');
  if v_relid is null or not exists (
    select 1 from pg_catalog.pg_class as c where c.oid = v_relid and c.relkind in ('r', 'p')
  ) then
    raise exception '%: table % does not exist.', v_where, trigger ->> 'table'
      using errcode = '42P01',
        hint = 'Create the table before applying the flow''s migration, or fix `table:` in the spec (schema.table; a view cannot have one).';
  end if;
  if not pg_catalog.has_table_privilege(session_user, v_relid, 'TRIGGER') then
    raise exception '%: role % may not put triggers on table %.', v_where, session_user, v_relid::regclass
      using errcode = '42501',
        hint = format('The role applying the migration needs the TRIGGER privilege: grant trigger on %s to %I.', v_relid::regclass, session_user);
  end if;
  select pg_catalog.pg_get_userbyid(c.relowner) into v_owner
  from pg_catalog.pg_class as c
  where c.oid = v_relid and not pg_catalog.pg_has_role(current_user, c.relowner, 'MEMBER');
  if found then
    raise exception '%: the engine''s owner, %, neither owns table % nor is a member of its owner, %, so it could not drop the trigger again.',
      v_where, current_user, v_relid::regclass, v_owner
      using errcode = '42501',
        hint = format('Make it a member of the table''s owner (grant %I to %I), or give it the table.', v_owner, current_user);
  end if;

  -- on: insert, update or both.
  if jsonb_typeof(v_events) is distinct from 'array' or jsonb_array_length(v_events) = 0
    or exists (select 1 from jsonb_array_elements(v_events) as e where e not in ('"insert"', '"update"'))
    or (select count(distinct e) <> count(*) from jsonb_array_elements(v_events) as e)
  then
    raise exception '%: "on" must list insert, update or both, got %.', v_where, v_events::text
      using errcode = '22023';
  end if;
  v_events := (select jsonb_agg(e order by e) from jsonb_array_elements(v_events) as e);
  if v_on_error not in ('raise', 'skip') then
    raise exception '%: "onError" must be raise or skip, got %.', v_where, trigger -> 'onError'
      using errcode = '22023';
  end if;

  -- input: {input key: column}, the flow's input schema satisfied.
  if jsonb_typeof(input_schema -> 'type') = 'string' and input_schema ->> 'type' <> 'object' then
    raise exception '%: a trigger starts runs with an object of columns, but the flow''s input is a %.',
      v_where, input_schema ->> 'type' using errcode = '42804';
  end if;
  if jsonb_typeof(trigger -> 'input') is distinct from 'object' then
    raise exception '%: "input" must map input keys to columns, got %.', v_where,
      coalesce((trigger -> 'input')::text, 'nothing') using errcode = '22023';
  end if;
  for v_item in select i.key, i.value from jsonb_each(trigger -> 'input') as i order by i.key loop
    if jsonb_typeof(v_item.value) <> 'string' then
      raise exception '%: input "%" must name a column, got %.', v_where, v_item.key, v_item.value
        using errcode = '22023';
    end if;
    v_type := pgflow._column_type(v_relid, v_item.value #>> '{}');
    if v_type is null then
      raise exception '%: input "%" takes column %, which table % does not have.', v_where,
        v_item.key, v_item.value #>> '{}', v_relid::regclass
        using errcode = '42703', hint = 'Column names are case-sensitive, as the catalog spells them.';
    end if;
    if not pgflow._column_fits_json(v_type, input_schema -> 'properties' -> v_item.key) then
      raise exception '%: input "%" takes column % of %, a %, but the flow''s input schema says %.',
        v_where, v_item.key, v_item.value #>> '{}', v_relid::regclass, pg_catalog.format_type(v_type, null),
        input_schema -> 'properties' -> v_item.key -> 'type'
        using errcode = '42804',
          hint = 'Map a column whose values (as to_jsonb gives them) are of that JSON type, or change the flow''s input schema.';
    end if;
  end loop;
  select k into v_key
  from jsonb_array_elements_text(case when jsonb_typeof(input_schema -> 'required') = 'array'
    then input_schema -> 'required' else '[]' end) as k
  where not (trigger -> 'input') ? k
  order by k limit 1;
  if found then
    raise exception '%: the flow''s input requires key "%", which "input" does not map.', v_where, v_key
      using errcode = '22023';
  end if;

  -- when: {column: {operator: value}}, as SQL the database trigger tests.
  if jsonb_typeof(v_when) <> 'object' then
    raise exception '%: "when" must map columns to tests, got %.', v_where, v_when
      using errcode = '22023';
  end if;
  for v_item in select w.key, w.value from jsonb_each(v_when) as w order by w.key loop
    if pgflow._column_type(v_relid, v_item.key) is null then
      raise exception '%: "when" tests column %, which table % does not have.', v_where, v_item.key,
        v_relid::regclass using errcode = '42703';
    end if;
    if jsonb_typeof(v_item.value) <> 'object' or v_item.value = '{}' then
      raise exception '%: "when" must give column % tests as {operator: value}, got %.', v_where,
        v_item.key, v_item.value using errcode = '22023';
    end if;
    for v_test in select t.key, t.value from jsonb_each(v_item.value) as t order by t.key loop
      v_operator := case v_test.key when 'eq' then '=' when 'ne' then '<>' when 'gt' then '>'
        when 'gte' then '>=' when 'lt' then '<' when 'lte' then '<=' end;
      if v_operator is not null and jsonb_typeof(v_test.value) in ('string', 'number', 'boolean') then
        v_tests := v_tests || format('new.%I %s %L', v_item.key, v_operator, v_test.value #>> '{}');
      elsif v_test.key = 'in' and jsonb_typeof(v_test.value) = 'array'
        and jsonb_array_length(v_test.value) > 0
        and not exists (select 1 from jsonb_array_elements(v_test.value) as x
          where jsonb_typeof(x) not in ('string', 'number', 'boolean'))
      then
        v_tests := v_tests || format('new.%I in (%s)', v_item.key,
          (select string_agg(format('%L', x #>> '{}'), ', ') from jsonb_array_elements(v_test.value) as x));
      elsif v_test.key = 'is_null' and jsonb_typeof(v_test.value) = 'boolean' then
        v_tests := v_tests || format('new.%I is %snull', v_item.key,
          case when v_test.value = 'true' then '' else 'not ' end);
      elsif v_test.key = 'changed' and jsonb_typeof(v_test.value) = 'boolean' then
        if v_events <> '["update"]' then
          raise exception '%: "when" tests whether column % changed, which only an update can say.',
            v_where, v_item.key using errcode = '22023', hint = 'Give the trigger on: [update] alone.';
        end if;
        v_tests := v_tests || format('old.%I is %sdistinct from new.%I', v_item.key,
          case when v_test.value = 'true' then '' else 'not ' end, v_item.key);
      else
        raise exception '%: "when" cannot test column % with % %.', v_where, v_item.key, v_test.key,
          v_test.value
          using errcode = '22023',
            hint = 'Tests: eq, ne, gt, gte, lt, lte (a scalar), in (a list of scalars), is_null and changed (true or false).';
      end if;
    end loop;
  end loop;

  v_row.flow_slug := flow_slug;
  v_row.trigger_name := trigger ->> 'name';
  v_row.table_name := v_relid::regclass::text;
  v_row.relid := v_relid;
  -- pgflow_<flow>__<name>: a flow slug holds no "__" and ends with no "_", so no two flows'
  -- triggers share a name; hashed when longer than PostgreSQL's 63 bytes.
  v_row.pg_trigger_name := case
    when octet_length(format('pgflow_%s__%s', flow_slug, trigger ->> 'name')) <= 63
    then format('pgflow_%s__%s', flow_slug, trigger ->> 'name')
    else 'pgflow_' || left(md5(flow_slug || '/' || (trigger ->> 'name')), 24)
  end;
  v_row.definition := jsonb_build_object('table', trigger -> 'table', 'on', v_events,
    'when', v_when, 'input', trigger -> 'input', 'onError', v_on_error);
  v_row.condition := nullif(array_to_string(v_tests, ' and '), '');
  v_row.on_error := v_on_error;
  return v_row;
end;
$$;

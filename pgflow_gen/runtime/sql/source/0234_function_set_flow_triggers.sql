-- Makes the table triggers of a flow what `triggers` lists (engine 0032): a JSON array of
-- triggers as pgflow._checked_trigger takes them, every one checked before anything changes (a
-- refusal names the flow, the trigger and where). Creates the new ones, drops those no longer
-- listed (with their database triggers), replaces the changed ones and leaves the others alone,
-- so applying the same list again takes no lock on any table. '[]' drops them all.
-- Returns {"created": [...], "dropped": [...], "replaced": [...], "kept": [...]} (names), and a
-- "summary" for people when something changed. The flow's generated migration calls it.
-- An admin's function; the session's login role also needs the TRIGGER privilege on each table,
-- and the engine's owner, who creates and drops the triggers, must own it or be a member of its
-- owner. Takes the flow's definition lock, then, to create or drop a trigger, a lock on its
-- table: a write to that table waiting for the definition lock (its trigger's start) meanwhile
-- ends in a deadlock error for one of the two (run again); unchanged triggers take no lock.
create function pgflow.set_flow_triggers(flow_slug text, triggers jsonb)
returns jsonb
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_schema jsonb;
  v_wanted pgflow.flow_triggers[] := '{}';
  v_trigger pgflow.flow_triggers;
  v_item jsonb;
  v_kept text[];
  v_dropped text[];
  v_created text[] := '{}';
  v_replaced text[];
begin
  perform pgflow._lock_flow_definition(flow_slug);
  select f.input_schema into v_schema from pgflow.flows as f
  where f.flow_slug = set_flow_triggers.flow_slug;
  if not found then
    raise exception 'Flow "%" does not exist.', flow_slug
      using errcode = 'P0002', hint = 'Compile the flow before setting its triggers.';
  end if;
  if jsonb_typeof(triggers) is distinct from 'array' then
    raise exception 'Flow "%": its triggers must be a JSON array, got %.', flow_slug,
      coalesce(jsonb_typeof(triggers), 'NULL') using errcode = '22023';
  end if;
  for v_item in select t from jsonb_array_elements(triggers) as t loop
    v_trigger := pgflow._checked_trigger(flow_slug, v_item, v_schema);
    if exists (select 1 from unnest(v_wanted) as w where w.trigger_name = v_trigger.trigger_name) then
      raise exception 'Flow "%" has two triggers named "%".', flow_slug, v_trigger.trigger_name
        using errcode = '22023', hint = 'Give each trigger of a flow its own name.';
    end if;
    v_wanted := v_wanted || v_trigger;
  end loop;

  -- Kept: the same definition on the same table, its database trigger still there (found by
  -- its function and arguments: a trigger renamed by hand is still the one).
  v_kept := array(
    select t.trigger_name from pgflow.flow_triggers as t
    join unnest(v_wanted) as w on w.trigger_name = t.trigger_name and w.relid = t.relid
      and w.definition = t.definition
    where t.flow_slug = set_flow_triggers.flow_slug
      and exists (select 1 from pg_catalog.pg_trigger as g
        where g.tgrelid = t.relid and g.tgfoid = 'pgflow._table_trigger'::regproc
          and g.tgparentid = 0
          and g.tgargs = pgflow._trigger_args(t.flow_slug, t.trigger_name))
    order by t.trigger_name
  );
  v_dropped := pgflow._drop_flow_triggers(flow_slug, v_kept);
  foreach v_trigger in array v_wanted loop
    continue when v_trigger.trigger_name = any (v_kept);
    perform pgflow._create_table_trigger(v_trigger);
    v_created := v_created || v_trigger.trigger_name;
  end loop;
  v_replaced := array(select c from unnest(v_created) as c where c = any (v_dropped) order by c);
  v_created := array(select c from unnest(v_created) as c where c <> all (v_replaced) order by c);
  v_dropped := array(select d from unnest(v_dropped) as d where d <> all (v_replaced) order by d);
  return jsonb_build_object('created', to_jsonb(v_created), 'dropped', to_jsonb(v_dropped),
    'replaced', to_jsonb(v_replaced), 'kept', to_jsonb(v_kept),
    'summary', nullif(concat_ws('; ',
      'triggers created: ' || nullif(array_to_string(v_created, ', '), ''),
      'triggers replaced: ' || nullif(array_to_string(v_replaced, ', '), ''),
      'triggers dropped: ' || nullif(array_to_string(v_dropped, ', '), '')), ''));
end;
$$;

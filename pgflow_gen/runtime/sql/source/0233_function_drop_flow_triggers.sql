-- Drops the table triggers of flow_slug but those named in keep (engine 0032): each database
-- trigger still on its table, and its row. Returns the names dropped, in name order.
-- Called by pgflow.set_flow_triggers and pgflow.delete_flow_and_data, under the flow's
-- definition lock.
create function pgflow._drop_flow_triggers(flow_slug text, keep text[] default '{}')
returns text[]
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_trigger pgflow.flow_triggers;
  v_dropped text[] := '{}';
begin
  for v_trigger in
    delete from pgflow.flow_triggers as t
    where t.flow_slug = _drop_flow_triggers.flow_slug and t.trigger_name <> all (keep)
    returning *
  loop
    if exists (
      select 1 from pg_catalog.pg_trigger as g
      where g.tgrelid = v_trigger.relid and g.tgname = v_trigger.pg_trigger_name
        and g.tgfoid = 'pgflow._table_trigger'::regproc
    ) then
      execute format('drop trigger %I on %s', v_trigger.pg_trigger_name, v_trigger.relid::regclass);
    end if;
    v_dropped := v_dropped || v_trigger.trigger_name;
  end loop;
  return (select coalesce(array_agg(d order by d), '{}') from unnest(v_dropped) as d);
end;
$$;

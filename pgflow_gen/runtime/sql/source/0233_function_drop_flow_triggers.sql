-- Drops the table triggers of flow_slug but those named in keep (engine 0032): each database
-- trigger still on its table (found by its function and arguments, whatever it is named now),
-- and its row. Returns the names dropped, in name order.
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
  v_name name;
  v_dropped text[] := '{}';
begin
  for v_trigger in
    delete from pgflow.flow_triggers as t
    where t.flow_slug = _drop_flow_triggers.flow_slug and t.trigger_name <> all (keep)
    returning *
  loop
    for v_name in
      select g.tgname from pg_catalog.pg_trigger as g
      where g.tgrelid = v_trigger.relid and g.tgfoid = 'pgflow._table_trigger'::regproc
        and g.tgparentid = 0
        and g.tgargs = pgflow._trigger_args(v_trigger.flow_slug, v_trigger.trigger_name)
    loop
      execute format('drop trigger %I on %s', v_name, v_trigger.relid::regclass);
    end loop;
    v_dropped := v_dropped || v_trigger.trigger_name;
  end loop;
  return (select coalesce(array_agg(d order by d), '{}') from unnest(v_dropped) as d);
end;
$$;

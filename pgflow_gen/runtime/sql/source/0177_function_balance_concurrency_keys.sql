-- Settles a committing transaction's keyed tasks (engine 0018), a deferred constraint trigger on
-- pgflow.concurrency_events: its first firing takes every event of the transaction (later ones find
-- none pending) and, key by key in key order (so transactions never deadlock on the keys), counts
-- the places freed, drops finished tasks from the line, and gives the oldest parked tasks a message
-- while the key has room under its step's opt_concurrency_limit (no limit: all of them; a step's
-- start delay still applies). A parked task another transaction has locked (it is being cancelled,
-- and settles its key when it commits) is passed over. A key with nothing admitted and nothing
-- parked loses its row.
create function pgflow._balance_concurrency_keys()
returns trigger
language plpgsql
security definer
set search_path = ''
set enable_seqscan = off
as $$
declare
  v_key record;
  v_limit int;
  v_admitted int;
begin
  -- The setting spares the later firings a look at the table, but the session could clear it:
  -- without it, the transaction's own events decide (engine 0019).
  if current_setting('pgflow.concurrency_events', true) is distinct from 'pending'
    and not exists (select 1 from pgflow.concurrency_events as e where e.xact = pg_current_xact_id()) then
    return null;
  end if;
  perform set_config('pgflow.concurrency_events', '', true);

  for v_key in
    with taken as (
      delete from pgflow.concurrency_events as e where e.xact = pg_current_xact_id() returning e.*
    )
    select t.flow_slug, t.step_slug, t.concurrency_key, sum(t.released)::int as released,
      bool_or(t.parked) as parked,
      array_agg(t.gone_run_id) filter (where t.gone_run_id is not null) as gone_runs,
      array_agg(t.gone_task_index) filter (where t.gone_run_id is not null) as gone_indexes
    from taken as t
    group by t.flow_slug, t.step_slug, t.concurrency_key
    order by t.flow_slug, t.step_slug, t.concurrency_key
  loop
    -- GUARD: a key whose freed places all went to parked tasks (pgflow._pass_concurrency_places)
    -- has nothing left to settle; its row is not locked.
    continue when v_key.released = 0 and not v_key.parked and v_key.gone_runs is null;
    select s.opt_concurrency_limit into v_limit
    from pgflow.steps as s where s.flow_slug = v_key.flow_slug and s.step_slug = v_key.step_slug;
    continue when not found;  -- the flow was deleted in this transaction
    insert into pgflow.concurrency_keys (flow_slug, step_slug, concurrency_key)
    values (v_key.flow_slug, v_key.step_slug, v_key.concurrency_key)
    on conflict on constraint concurrency_keys_pkey do nothing;
    select k.admitted - v_key.released into v_admitted
    from pgflow.concurrency_keys as k
    where k.flow_slug = v_key.flow_slug and k.step_slug = v_key.step_slug
      and k.concurrency_key = v_key.concurrency_key
    for update;
    v_admitted := greatest(v_admitted, 0);

    -- The parked rows of tasks that finished leave the line. One that another transaction's
    -- pick has locked (it found the task locked by this one) stays: a pick passes over it, as
    -- its task is not queued, and it goes with the task when the run is pruned.
    if v_key.gone_runs is not null then
      delete from pgflow.parked_tasks as p
      where p.ctid = any (array(
        select x.ctid from pgflow.parked_tasks as x
        where x.run_id = any (v_key.gone_runs) and x.step_slug = v_key.step_slug
          and (x.run_id, x.task_index) in (
            select g.run_id, g.task_index from unnest(v_key.gone_runs, v_key.gone_indexes) as g (run_id, task_index)
          )
        for update of x skip locked
      ));
    end if;

    if (v_limit is null or v_admitted < v_limit) and exists (
      select 1 from pgflow.parked_tasks as p
      where p.flow_slug = v_key.flow_slug and p.step_slug = v_key.step_slug
        and p.concurrency_key = v_key.concurrency_key
    ) then
      v_admitted := v_admitted + pgflow._unpark_tasks(v_key.flow_slug, v_key.step_slug,
        v_key.concurrency_key, v_limit - v_admitted);
    end if;

    if v_admitted = 0 and not exists (
      select 1 from pgflow.parked_tasks as p
      join pgflow.step_tasks as t
        on t.run_id = p.run_id and t.step_slug = p.step_slug and t.task_index = p.task_index
      where p.flow_slug = v_key.flow_slug and p.step_slug = v_key.step_slug
        and p.concurrency_key = v_key.concurrency_key and t.status = 'queued'
    ) then
      delete from pgflow.concurrency_keys as k
      where k.flow_slug = v_key.flow_slug and k.step_slug = v_key.step_slug
        and k.concurrency_key = v_key.concurrency_key;
    else
      update pgflow.concurrency_keys as k set admitted = v_admitted
      where k.flow_slug = v_key.flow_slug and k.step_slug = v_key.step_slug
        and k.concurrency_key = v_key.concurrency_key;
    end if;
  end loop;
  return null;
end;
$$;

create constraint trigger concurrency_events_balance
after insert on pgflow.concurrency_events
deferrable initially deferred
for each row
execute function pgflow._balance_concurrency_keys();

-- Creates the tasks of a keyed step (engine 0018) in the given runs, task_counts[i] of them in
-- run_ids[i] (one for a single step, one per element for a map): each takes the value of the
-- step's key in its run's input (the empty key when the input has none) and waits parked, in the
-- order given, with the step's start delay counted from now. Their keys are settled when the
-- transaction commits (pgflow._balance_concurrency_keys), which gives the first of them their
-- messages as far as each key has room. Called by pgflow._advance_run and pgflow.start_flows.
create function pgflow._park_keyed_tasks(
  flow_slug text,
  step_slug text,
  queue_name text,
  key_path text,
  delay_seconds int,
  run_ids uuid[],
  task_counts int[]
)
returns void
language plpgsql
volatile
set search_path = ''
set enable_seqscan = off
as $$
begin
  -- One statement, joining only the rows it inserts (a join with step_tasks itself could walk
  -- the whole table under a generic plan).
  with tasks as (
    insert into pgflow.step_tasks (run_id, flow_slug, step_slug, task_index, queue_name, concurrency_key)
    select r.run_id, _park_keyed_tasks.flow_slug, _park_keyed_tasks.step_slug, i, _park_keyed_tasks.queue_name,
      coalesce(jsonb_path_query_first(x.input, key_path::jsonpath) #>> '{}', '')
    from unnest(run_ids, task_counts) with ordinality as r (run_id, tasks, ord)
    join pgflow.runs as x on x.run_id = r.run_id
    cross join lateral generate_series(0, r.tasks - 1) as i
    returning run_id, task_index, concurrency_key
  ),
  parked as (
    insert into pgflow.parked_tasks (flow_slug, step_slug, concurrency_key, run_id, task_index, not_before)
    select _park_keyed_tasks.flow_slug, _park_keyed_tasks.step_slug, t.concurrency_key, t.run_id,
      t.task_index, clock_timestamp() + make_interval(secs => delay_seconds)
    from tasks as t
    join unnest(run_ids) with ordinality as r (run_id, ord) on r.run_id = t.run_id
    order by r.ord, t.task_index
    returning concurrency_key
  )
  insert into pgflow.concurrency_events (flow_slug, step_slug, concurrency_key, parked)
  select distinct _park_keyed_tasks.flow_slug, _park_keyed_tasks.step_slug, p.concurrency_key, true
  from parked as p;
  perform set_config('pgflow.concurrency_events', 'pending', true);
end;
$$;

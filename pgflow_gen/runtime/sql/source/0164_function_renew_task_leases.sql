-- A live worker holding results it cannot send yet (the rows they need are locked, statements
-- time out) renews their tasks' leases, so stall recovery does not run them again: sets
-- lease_renewed_at on the given attempts that are still this worker's and started. Skips task
-- rows locked by someone else (a completion under way). Returns how many it renewed. Called
-- with each heartbeat while such results wait.
create function pgflow.renew_task_leases(
  worker_id uuid,
  run_ids uuid[],
  step_slugs text[],
  task_indexes int[],
  attempts int[]
)
returns int
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_renewed int;
begin
  perform pgflow._require_task_routes(run_ids, step_slugs);
  with held as (
    select t.run_id, t.step_slug, t.task_index
    from unnest(run_ids, step_slugs, task_indexes, attempts) as k (run_id, step_slug, task_index, attempt)
    join pgflow.step_tasks as t
      on t.run_id = k.run_id and t.step_slug = k.step_slug and t.task_index = k.task_index
    where t.status = 'started' and t.attempts_count = k.attempt
      and t.last_worker_id = renew_task_leases.worker_id
    order by t.run_id, t.step_slug, t.task_index
    for update of t skip locked
  )
  update pgflow.step_tasks as t set lease_renewed_at = clock_timestamp()
  from held
  where t.run_id = held.run_id and t.step_slug = held.step_slug and t.task_index = held.task_index;
  get diagnostics v_renewed = row_count;
  return v_renewed;
end;
$$;

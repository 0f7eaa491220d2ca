-- Recovers tasks whose worker vanished: the tasks pgflow.find_stalled_tasks names (worker gone,
-- or lease run out; never a task a live worker runs within its timeout). A stalled task is queued
-- again and its message made visible, at most 3 times (without using an attempt of its budget);
-- after that the engine gives up on it (engine 0020): each further stall fails the attempt
-- ("Stalled N times: no live worker kept it"), which then follows the step's policy like any
-- failure (pgflow._fail_attempt: retried after its delay while attempts are left, else the run
-- fails or the step is skipped), so no run waits for ever on a task nobody holds.
-- Skips locked tasks (and, for the tasks it gives up on, locked runs and step states). Locks
-- those in the engine's order (run, step state, task), then the tasks to requeue; a second
-- statement re-checks every locked task with a fresh snapshot, so a task claimed a moment ago by
-- a worker that registered after the first statement began is left alone.
-- Also archives the completed tasks' messages still waiting in pgflow.archivable_messages, and
-- ends the signal steps whose wait ran out (_expire_signal_steps; not counted in the result).
-- Returns the number of tasks requeued or failed.
create function pgflow.requeue_stalled_tasks()
returns int
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_up_runs uuid[];
  v_up_steps text[];
  v_up_indexes int[];
  v_run_ids uuid[];
  v_step_slugs text[];
  v_task_indexes int[];
  v_queue text;
  v_ids bigint[];
  v_given_up record;
  v_failed int := 0;
  v_requeue_queues text[];
  v_requeue_messages bigint[];
begin
  -- A step role whose step is gone does nothing here either (engine 0020).
  perform pgflow._require_flow_route(null);
  -- Periodic maintenance is also where idle queues get their completed messages archived; first,
  -- before any task row is locked (the drain takes no task locks, so no order to invert).
  perform pgflow.archive_completed_messages();
  -- And where signal steps stop waiting once their timeout has passed (engine 0011).
  perform pgflow._expire_signal_steps();

  -- The candidates, without locks (this statement's snapshot may predate a worker that claimed
  -- one since): the ones requeued 3 times already are given up on.
  select
    array_agg(t.run_id) filter (where t.requeued_count >= 3),
    array_agg(t.step_slug) filter (where t.requeued_count >= 3),
    array_agg(t.task_index) filter (where t.requeued_count >= 3),
    array_agg(t.run_id) filter (where t.requeued_count < 3),
    array_agg(t.step_slug) filter (where t.requeued_count < 3),
    array_agg(t.task_index) filter (where t.requeued_count < 3)
  into v_up_runs, v_up_steps, v_up_indexes, v_run_ids, v_step_slugs, v_task_indexes
  from pgflow.find_stalled_tasks() as c
  join pgflow.step_tasks as t
    on t.run_id = c.run_id and t.step_slug = c.step_slug and t.task_index = c.task_index;
  if v_up_runs is null and v_run_ids is null then
    return 0;
  end if;

  -- Lock the tasks to give up on with their runs and step states, in the engine's order and
  -- skipping any row someone holds (a callback or a claim on it right now decides it instead).
  select array_agg(x.run_id), array_agg(x.step_slug), array_agg(x.task_index)
  into v_up_runs, v_up_steps, v_up_indexes
  from (
    select t.run_id, t.step_slug, t.task_index
    from unnest(v_up_runs, v_up_steps, v_up_indexes) as k (run_id, step_slug, task_index)
    join pgflow.runs as r on r.run_id = k.run_id
    join pgflow.step_states as ss on ss.run_id = k.run_id and ss.step_slug = k.step_slug
    join pgflow.step_tasks as t on t.run_id = k.run_id and t.step_slug = k.step_slug and t.task_index = k.task_index
    order by k.run_id, k.step_slug, k.task_index
    for update of r, ss, t skip locked
  ) as x;
  -- Then the tasks to requeue (task rows only: nothing else changes for them).
  select array_agg(x.run_id), array_agg(x.step_slug), array_agg(x.task_index)
  into v_run_ids, v_step_slugs, v_task_indexes
  from (
    select t.run_id, t.step_slug, t.task_index
    from unnest(v_run_ids, v_step_slugs, v_task_indexes) as k (run_id, step_slug, task_index)
    join pgflow.step_tasks as t on t.run_id = k.run_id and t.step_slug = k.step_slug and t.task_index = k.task_index
    for update of t skip locked
  ) as x;

  -- GUARD: a new statement, a new snapshot: only the locked tasks that are still stalled change.
  for v_given_up in
    select c.run_id, c.step_slug, c.task_index, t.requeued_count
    from pgflow.find_stalled_tasks() as c
    join unnest(v_up_runs, v_up_steps, v_up_indexes) as k (run_id, step_slug, task_index)
      on k.run_id = c.run_id and k.step_slug = c.step_slug and k.task_index = c.task_index
    join pgflow.step_tasks as t
      on t.run_id = c.run_id and t.step_slug = c.step_slug and t.task_index = c.task_index
    order by c.run_id, c.step_slug, c.task_index
  loop
    -- An earlier task of the same run may have failed it since: then this one was cancelled.
    if exists (
      select 1 from pgflow.step_tasks as t
      join pgflow.step_states as ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug
      join pgflow.runs as r on r.run_id = t.run_id
      where t.run_id = v_given_up.run_id and t.step_slug = v_given_up.step_slug
        and t.task_index = v_given_up.task_index
        and t.status = 'started' and ss.status = 'started' and r.status = 'started'
    ) then
      perform pgflow._fail_attempt(v_given_up.run_id, v_given_up.step_slug, v_given_up.task_index,
        format('Stalled %s times: no live worker kept it', v_given_up.requeued_count + 1));
      v_failed := v_failed + 1;
    end if;
  end loop;

  with stalled as (
    select c.run_id, c.step_slug, c.task_index
    from pgflow.find_stalled_tasks() as c
    join unnest(v_run_ids, v_step_slugs, v_task_indexes) as k (run_id, step_slug, task_index)
      on k.run_id = c.run_id and k.step_slug = c.step_slug and k.task_index = c.task_index
  ),
  changed as (
    update pgflow.step_tasks as t
    set status = 'queued', started_at = null, last_worker_id = null,
      requeued_count = t.requeued_count + 1, last_requeued_at = clock_timestamp()
    from stalled
    where t.run_id = stalled.run_id and t.step_slug = stalled.step_slug and t.task_index = stalled.task_index
    returning t.queue_name, t.message_id
  )
  select array_agg(c.queue_name), array_agg(c.message_id)
  into v_requeue_queues, v_requeue_messages
  from changed as c;

  -- Requeued tasks become visible at once.
  for v_queue in select distinct q from unnest(v_requeue_queues) as q loop
    v_ids := array(select x.m from unnest(v_requeue_queues, v_requeue_messages) as x (q, m) where x.q = v_queue);
    perform pgflow._set_vt_batch(v_queue, v_ids, array_fill(0, array[cardinality(v_ids)]));
  end loop;
  return coalesce(cardinality(v_requeue_messages), 0) + v_failed;
end;
$$;

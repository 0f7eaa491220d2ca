-- Starts a failed run again from where it failed (for retry_run, and engine 0028's retry of a
-- subflow step's child run). Its failed steps, and the steps it left unfinished when it failed, run
-- again: every task of theirs that did not complete (it failed, or the failure cancelled it) is
-- queued again with a fresh message, visible after delay_seconds (a keyed one is parked, engine
-- 0018), and its whole retry budget, keeping its last error. Its attempt numbers go on (engine
-- 0020: the budget counts from attempts_before_retry), so a late result of an attempt before the
-- retry stays stale. Completed tasks and steps keep their outputs and do not run again (in a map
-- only the failed and unfinished elements run); skipped steps stay skipped. A step that failed
-- without a task (a condition with when_unmet = fail, a signal that did not come) is ready again
-- and decided anew, and a signal step that waits starts a new wait. A subflow step's unfinished
-- task starts its next attempt: its failed child run is retried the same way, a cancelled one is
-- replaced by a new child run. The run is started again (retry_count + 1, retried_at); one
-- event, run:retried.
-- Returns null; or, changing nothing, the slug of a step its flow gained since the run started.
-- The caller has checked the run is failed. Locks the run, its step states and its tasks, in
-- that order, as every callback does; then it sends the new messages.
create function pgflow._retry_run(run_id uuid, delay_seconds int)
returns text
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_added text;
  v_flow_slug text;
  v_subflow record;
  v_child record;
  v_queue text;
  v_keys jsonb;
  v_sent record;
begin
  select r.flow_slug into v_flow_slug from pgflow.runs as r where r.run_id = _retry_run.run_id for update;
  -- GUARD: the run's steps must still be its flow's (add_step can extend a flow-mode flow).
  select s.step_slug into v_added from pgflow.steps as s
  where s.flow_slug = v_flow_slug
    and not exists (
      select 1 from pgflow.step_states as ss where ss.run_id = _retry_run.run_id and ss.step_slug = s.step_slug
    )
  order by s.step_index
  limit 1;
  if v_added is not null then
    return v_added;
  end if;

  perform 1 from pgflow.step_states as ss
  where ss.run_id = _retry_run.run_id and ss.status in ('created', 'started', 'failed')
  order by ss.step_slug
  for update;
  perform 1 from pgflow.step_tasks as t
  join pgflow.step_states as ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug
  where t.run_id = _retry_run.run_id and ss.status in ('started', 'failed')
    and t.status in ('failed', 'cancelled')
  order by t.step_slug, t.task_index
  for update of t;

  -- The tasks that did not complete are queued again, each with a new message (visible after
  -- delay_seconds; with the run's priority, engine 0031). A subflow step's tasks have none (below).
  for v_queue, v_keys in
    select t.queue_name, jsonb_agg(jsonb_build_object(
        'flow_slug', t.flow_slug, 'run_id', t.run_id, 'step_slug', t.step_slug, 'task_index', t.task_index
      ) || pgflow._priority_key(r.priority) order by t.step_slug, t.task_index)
    from pgflow.step_tasks as t
    join pgflow.step_states as ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug
    join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    join pgflow.runs as r on r.run_id = t.run_id
    where t.run_id = _retry_run.run_id and ss.status in ('started', 'failed')
      and t.status in ('failed', 'cancelled') and t.concurrency_key is null and s.subflow_slug is null
    group by t.queue_name
    order by t.queue_name
  loop
    for v_sent in execute format(
      'insert into pgmq.%I (vt, message) select $2, k.value from jsonb_array_elements($1) as k'
      ' returning msg_id, message ->> ''step_slug'' as step_slug, (message ->> ''task_index'')::int as task_index',
      pgflow.pgmq_table_name(v_queue))
      using v_keys, clock_timestamp() + make_interval(secs => delay_seconds)
    loop
      update pgflow.step_tasks as t
      set status = 'queued', message_id = v_sent.msg_id, attempts_before_retry = t.attempts_count,
        queued_at = clock_timestamp(),
        started_at = null, failed_at = null, output = null, last_worker_id = null, requeued_count = 0,
        last_requeued_at = null, permanently_stalled_at = null, claimed_timeout = null, lease_renewed_at = null
      where t.run_id = _retry_run.run_id and t.step_slug = v_sent.step_slug and t.task_index = v_sent.task_index;
    end loop;
  end loop;

  -- A keyed task (engine 0018) is queued without a message: it is parked, and gets one when its
  -- key has room.
  update pgflow.step_tasks as t
  set status = 'queued', message_id = null, attempts_before_retry = t.attempts_count,
    queued_at = clock_timestamp(),
    started_at = null, failed_at = null, output = null, last_worker_id = null, requeued_count = 0,
    last_requeued_at = null, permanently_stalled_at = null, claimed_timeout = null, lease_renewed_at = null
  from pgflow.step_states as ss
  where t.run_id = _retry_run.run_id and ss.run_id = t.run_id and ss.step_slug = t.step_slug
    and ss.status in ('started', 'failed') and t.status in ('failed', 'cancelled')
    and t.concurrency_key is not null;

  -- A subflow step's task (engine 0028) starts its next attempt at once: its child run resumes
  -- below, once this run is started again.
  with restarted as (
    update pgflow.step_tasks as t
    set status = 'started', attempts_before_retry = t.attempts_count, attempts_count = t.attempts_count + 1,
      started_at = clock_timestamp(), failed_at = null, output = null
    from pgflow.step_states as ss, pgflow.steps as s
    where t.run_id = _retry_run.run_id and ss.run_id = t.run_id and ss.step_slug = t.step_slug
      and s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
      and ss.status in ('started', 'failed') and t.status in ('failed', 'cancelled')
      and s.subflow_slug is not null
    returning t.step_slug, t.task_index
  )
  select array_agg(x.step_slug order by x.step_slug, x.task_index) as step_slugs,
    array_agg(x.task_index order by x.step_slug, x.task_index) as task_indexes
  into v_subflow
  from restarted as x;

  -- Steps with tasks run again (their unfinished tasks are queued); failed ones without (a
  -- condition, a signal) are ready again; a waiting signal step waits anew.
  with counts as (
    select ss.step_slug, ss.status, s.step_type, count(x.task_index)::int as tasks,
      count(x.task_index) filter (where x.status <> 'completed')::int as unfinished
    from pgflow.step_states as ss
    join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    left join pgflow.step_tasks as x on x.run_id = ss.run_id and x.step_slug = ss.step_slug
    where ss.run_id = _retry_run.run_id and ss.status in ('started', 'failed')
    group by ss.step_slug, ss.status, s.step_type
  )
  update pgflow.step_states as ss
  set status = case when c.status = 'failed' and c.tasks = 0 then 'created' else 'started' end,
    remaining_tasks = case when c.tasks > 0 then c.unfinished when c.status = 'started' then ss.remaining_tasks end,
    started_at = case when c.step_type = 'signal' then clock_timestamp() else ss.started_at end,
    failed_at = null, error_message = null
  from counts as c
  where ss.run_id = _retry_run.run_id and ss.step_slug = c.step_slug;

  update pgflow.runs as r
  set status = 'started', failed_at = null, retry_count = r.retry_count + 1, retried_at = clock_timestamp()
  where r.run_id = _retry_run.run_id;
  perform pgflow._emit_event(run_id, 'run:retried', null, 'started');

  -- Each restarted subflow task's child: a failed one is retried in place (its completed steps
  -- keep their outputs); one that was cancelled, or cannot be retried, is replaced by a new run.
  for v_child in
    select k.step_slug, k.task_index, c.run_id as child_run_id, c.status as child_status
    from unnest(v_subflow.step_slugs, v_subflow.task_indexes) as k (step_slug, task_index)
    left join lateral (
      select x.run_id, x.status from pgflow.runs as x
      where x.parent_run_id = _retry_run.run_id and x.parent_step_slug = k.step_slug
        and x.parent_task_index = k.task_index
      order by x.started_at desc, x.run_id
      limit 1
    ) as c on true
  loop
    -- GUARD: a resumed child may have finished at once and failed this run again.
    exit when not exists (select 1 from pgflow.runs as r where r.run_id = _retry_run.run_id and r.status = 'started');
    if v_child.child_status is not distinct from 'failed' and pgflow._retry_run(v_child.child_run_id, 0) is null then
      continue;
    end if;
    perform pgflow._start_subflow_children(run_id, v_child.step_slug, array[v_child.task_index]);
  end loop;

  -- Steps ready but never started when the run failed, and the ones made ready above.
  if exists (select 1 from pgflow.runs as r where r.run_id = _retry_run.run_id and r.status = 'started') then
    perform pgflow._advance_run(run_id);
  end if;
  return null;
end;
$$;

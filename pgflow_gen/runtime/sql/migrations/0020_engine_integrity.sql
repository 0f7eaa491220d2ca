-- Engine migration 0020: engine integrity.
--
-- Attempt numbers of a task never repeat: retry_run keeps attempts_count and starts the retry
-- budget again from the new step_tasks.attempts_before_retry, so a late callback of an attempt
-- before the retry is stale for every fenced callback. A task stall recovery has requeued 3 times
-- is no longer parked for ever: each further stall fails its attempt ("Stalled N times: no live
-- worker kept it", pgflow._fail_attempt, shared with fail_task), which retries it while attempts
-- are left and else fails the run or skips the step, so retry_run can resume the run.
-- Tasks an older engine parked get a new message and are decided by the next stall sweep.


-- The attempts a task made before its run's last retry_run (see 0062_table_step_tasks.sql).
alter table pgflow.step_tasks add column attempts_before_retry int not null default 0;

-- Fails the current attempt of a started task (engine 0020: shared by fail_task and stall
-- recovery). With attempts left in its budget (attempts_count - attempts_before_retry below the
-- step's max_attempts) the task is queued again and its message hidden for base_delay * 2^attempts
-- of this budget; exhausted, when_exhausted decides: fail the run, skip the step, or skip it and
-- everything downstream. No retry either for a permanent failure (a `permanent_reason`: the stored
-- error gets a second line that says so and why) or for a task whose message is gone (nothing
-- could deliver the retry). The caller holds the run, step state and task row locks (in that
-- order) and has checked that all three are started; PGMQ rows are touched last.
create function pgflow._fail_attempt(
  run_id uuid, step_slug text, task_index int, error_message text, permanent_reason text default null
)
returns pgflow.step_tasks
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_step record;
  v_task pgflow.step_tasks;
  v_attempt int;
  v_delayed int;
  v_note text;
begin
  select * into v_task from pgflow.step_tasks as t
  where t.run_id = _fail_attempt.run_id and t.step_slug = _fail_attempt.step_slug
    and t.task_index = _fail_attempt.task_index;
  select s.when_exhausted,
    coalesce(s.opt_max_attempts, f.opt_max_attempts) as max_attempts,
    coalesce(s.opt_base_delay, f.opt_base_delay) as base_delay
  into v_step
  from pgflow.steps as s
  join pgflow.flows as f on f.flow_slug = s.flow_slug
  where s.flow_slug = v_task.flow_slug and s.step_slug = v_task.step_slug;
  -- The attempt within the task's budget (the budget starts again with each retry_run).
  v_attempt := v_task.attempts_count - v_task.attempts_before_retry;

  if v_attempt < v_step.max_attempts and v_task.permanently_stalled_at is null
    and permanent_reason is null then
    select count(*) into v_delayed from pgflow._set_vt_batch(v_task.queue_name, array[v_task.message_id],
      array[pgflow.calculate_retry_delay(v_step.base_delay, v_attempt)]);
    if v_delayed = 1 then
      update pgflow.step_tasks as t
      set status = 'queued', started_at = null, error_message = _fail_attempt.error_message
      where t.run_id = _fail_attempt.run_id and t.step_slug = _fail_attempt.step_slug
        and t.task_index = _fail_attempt.task_index
      returning * into v_task;
      return v_task;
    end if;
  end if;

  if permanent_reason is not null then
    -- After the error's first line (its summary), before the traceback.
    v_note := format('Not retried (attempt %s of %s): %s', v_attempt, v_step.max_attempts, permanent_reason);
    error_message := case when strpos(error_message, E'\n') > 0
      then left(error_message, strpos(error_message, E'\n') - 1) || E'\n' || v_note
        || substr(error_message, strpos(error_message, E'\n'))
      else coalesce(error_message || E'\n', '') || v_note end;
  end if;
  update pgflow.step_tasks as t
  set status = 'failed', failed_at = clock_timestamp(), error_message = _fail_attempt.error_message
  where t.run_id = _fail_attempt.run_id and t.step_slug = _fail_attempt.step_slug
    and t.task_index = _fail_attempt.task_index
  returning * into v_task;

  if v_step.when_exhausted = 'fail' then
    update pgflow.step_states as ss
    set status = 'failed', failed_at = clock_timestamp(), remaining_tasks = null,
      error_message = _fail_attempt.error_message
    where ss.run_id = _fail_attempt.run_id and ss.step_slug = _fail_attempt.step_slug;
    perform pgflow._emit_event(run_id, 'step:failed', step_slug, 'failed');
    perform pgflow._fail_run(run_id);
  else
    if v_step.when_exhausted = 'skip' then
      perform pgflow._skip_step(run_id, step_slug, 'handler_failed', error_message);
    else
      perform pgflow._skip_step_cascade(run_id, step_slug, 'handler_failed', error_message);
    end if;
    perform pgflow._advance_run(run_id);
  end if;

  -- Last: PGMQ rows are only touched after every task row this call needs is locked.
  perform pgmq.archive(v_task.queue_name, v_task.message_id);
  return v_task;
end;
$$;

-- A worker reports a task's failure: its current attempt fails (pgflow._fail_attempt: queued
-- again after base_delay * 2^attempts with attempts left in its budget; exhausted, when_exhausted
-- decides: fail the run, skip the step, or skip it and everything downstream). A failure with a
-- `permanent_reason` (engine 0011) is not retried, whatever attempts are left.
-- Locks run, step state and task (in that order, in one statement), then PGMQ rows.
-- Late callbacks change nothing, and so does a stale one (`attempt`, from claim_tasks, is not the
-- task's current attempt; attempt numbers never repeat, engine 0020): the task's row comes back
-- unchanged, a stale one's attempts_count differing from `attempt`.
create or replace function pgflow.fail_task(
  run_id uuid, step_slug text, task_index int, error_message text, attempt int,
  permanent_reason text default null
)
returns setof pgflow.step_tasks
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_locked record;
  v_task pgflow.step_tasks;
begin
  perform pgflow._require_task_routes(array[run_id], array[step_slug]);
  select r.status as run_status, ss.status as step_status, t as task into v_locked
  from pgflow.runs as r
  join pgflow.step_states as ss on ss.run_id = r.run_id and ss.step_slug = fail_task.step_slug
  join pgflow.step_tasks as t
    on t.run_id = r.run_id and t.step_slug = ss.step_slug and t.task_index = fail_task.task_index
  where r.run_id = fail_task.run_id
  for update of r, ss, t;
  if not found then
    if not exists (select 1 from pgflow.runs as r where r.run_id = fail_task.run_id) then
      raise exception 'Run % does not exist.', run_id using errcode = 'P0002';
    end if;
    raise exception 'Task % of step "%" in run % does not exist.', task_index, step_slug, run_id
      using errcode = 'P0002';
  end if;
  v_task := v_locked.task;

  -- GUARD: a callback of an earlier attempt is stale and changes nothing: since that attempt,
  -- the task failed and was retried, or stall recovery requeued it, and another claim started
  -- the attempt that is current now. A null attempt answers whichever attempt is current.
  if attempt is not null and v_task.attempts_count <> attempt then
    return next v_task;
    return;
  end if;

  -- GUARD: late callbacks are no-ops (cancellation and skips win).
  if v_locked.run_status <> 'started' or v_task.status <> 'started' or v_locked.step_status <> 'started' then
    return next v_task;
    return;
  end if;

  return next pgflow._fail_attempt(run_id, step_slug, task_index, error_message, permanent_reason);
end;
$$;

-- Retries a failed run from where it failed. Its failed steps, and the steps it left unfinished
-- when it failed, run again: every task of theirs that did not complete (it failed, or the failure
-- cancelled it) is queued again with a fresh message (a keyed one is parked, engine 0018) and its
-- whole retry budget, keeping its last error. Its attempt numbers go on (engine 0020: the budget
-- counts from attempts_before_retry), so a late result of an attempt before the retry stays stale.
-- Completed tasks and steps keep their outputs and do not run again (in a map only the failed and
-- unfinished elements run); skipped steps stay skipped. A step that failed without a task (a
-- condition with when_unmet = fail, a signal that did not come) is ready again and decided anew,
-- and a signal step that waits starts a new wait. The run is started again (retry_count + 1,
-- retried_at); one event, run:retried.
-- Refused, changing nothing: an unknown run (P0002), a run that is not failed, or one whose flow
-- has gained a step since it started (55000). Locks the run, its step states and its tasks, in
-- that order, as every callback does; then it sends the new messages.
create or replace function pgflow.retry_run(run_id uuid)
returns pgflow.runs
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_run pgflow.runs;
  v_added text;
  v_queue text;
  v_keys jsonb;
  v_sent record;
begin
  select * into v_run from pgflow.runs as r where r.run_id = retry_run.run_id for update;
  if not found then
    raise exception 'Run % does not exist.', run_id using errcode = 'P0002';
  end if;
  if v_run.status <> 'failed' then
    raise exception 'Run % is %; only a failed run can be retried.', run_id, v_run.status
      using errcode = '55000', hint = 'Nothing was changed.';
  end if;
  -- GUARD: the run's steps must still be its flow's (add_step can extend a flow-mode flow).
  select s.step_slug into v_added from pgflow.steps as s
  where s.flow_slug = v_run.flow_slug
    and not exists (
      select 1 from pgflow.step_states as ss where ss.run_id = retry_run.run_id and ss.step_slug = s.step_slug
    )
  order by s.step_index
  limit 1;
  if v_added is not null then
    raise exception 'Run % cannot be retried: flow "%" has changed since it started.', run_id, v_run.flow_slug
      using errcode = '55000', detail = format('Step "%s" was added to the flow after the run started.', v_added),
        hint = 'Nothing was changed. Start a new run.';
  end if;

  perform 1 from pgflow.step_states as ss
  where ss.run_id = retry_run.run_id and ss.status in ('created', 'started', 'failed')
  order by ss.step_slug
  for update;
  perform 1 from pgflow.step_tasks as t
  join pgflow.step_states as ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug
  where t.run_id = retry_run.run_id and ss.status in ('started', 'failed')
    and t.status in ('failed', 'cancelled')
  order by t.step_slug, t.task_index
  for update of t;

  -- The tasks that did not complete are queued again, each with a new message (visible now).
  for v_queue, v_keys in
    select t.queue_name, jsonb_agg(jsonb_build_object(
        'flow_slug', t.flow_slug, 'run_id', t.run_id, 'step_slug', t.step_slug, 'task_index', t.task_index
      ) order by t.step_slug, t.task_index)
    from pgflow.step_tasks as t
    join pgflow.step_states as ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug
    where t.run_id = retry_run.run_id and ss.status in ('started', 'failed')
      and t.status in ('failed', 'cancelled') and t.concurrency_key is null
    group by t.queue_name
    order by t.queue_name
  loop
    for v_sent in execute format(
      'insert into pgmq.%I (vt, message) select clock_timestamp(), k.value from jsonb_array_elements($1) as k'
      ' returning msg_id, message ->> ''step_slug'' as step_slug, (message ->> ''task_index'')::int as task_index',
      pgflow.pgmq_table_name(v_queue))
      using v_keys
    loop
      update pgflow.step_tasks as t
      set status = 'queued', message_id = v_sent.msg_id, attempts_before_retry = t.attempts_count,
        queued_at = clock_timestamp(),
        started_at = null, failed_at = null, output = null, last_worker_id = null, requeued_count = 0,
        last_requeued_at = null, permanently_stalled_at = null, claimed_timeout = null, lease_renewed_at = null
      where t.run_id = retry_run.run_id and t.step_slug = v_sent.step_slug and t.task_index = v_sent.task_index;
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
  where t.run_id = retry_run.run_id and ss.run_id = t.run_id and ss.step_slug = t.step_slug
    and ss.status in ('started', 'failed') and t.status in ('failed', 'cancelled')
    and t.concurrency_key is not null;

  -- Steps with tasks run again (their unfinished tasks are queued); failed ones without (a
  -- condition, a signal) are ready again; a waiting signal step waits anew.
  with counts as (
    select ss.step_slug, ss.status, s.step_type, count(x.task_index)::int as tasks,
      count(x.task_index) filter (where x.status <> 'completed')::int as unfinished
    from pgflow.step_states as ss
    join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    left join pgflow.step_tasks as x on x.run_id = ss.run_id and x.step_slug = ss.step_slug
    where ss.run_id = retry_run.run_id and ss.status in ('started', 'failed')
    group by ss.step_slug, ss.status, s.step_type
  )
  update pgflow.step_states as ss
  set status = case when c.status = 'failed' and c.tasks = 0 then 'created' else 'started' end,
    remaining_tasks = case when c.tasks > 0 then c.unfinished when c.status = 'started' then ss.remaining_tasks end,
    started_at = case when c.step_type = 'signal' then clock_timestamp() else ss.started_at end,
    failed_at = null, error_message = null
  from counts as c
  where ss.run_id = retry_run.run_id and ss.step_slug = c.step_slug;

  update pgflow.runs as r
  set status = 'started', failed_at = null, retry_count = r.retry_count + 1, retried_at = clock_timestamp()
  where r.run_id = retry_run.run_id;
  perform pgflow._emit_event(run_id, 'run:retried', null, 'started');
  -- Steps ready but never started when the run failed, and the ones made ready above.
  perform pgflow._advance_run(run_id);

  select * into v_run from pgflow.runs as r where r.run_id = retry_run.run_id;
  return v_run;
end;
$$;

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
create or replace function pgflow.requeue_stalled_tasks()
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


-- Tasks engine 0007-0019 parked (requeued 3 times, their message archived, the task left started)
-- kept their runs started for ever. Each gets a new message and stays started with its requeued
-- count, so the next stall sweep gives up on it as on any task stalled a fourth time: its attempt
-- fails and the step's policy decides (a retry while attempts are left, else the run fails or the
-- step is skipped).
do $$
declare
  v_task record;
begin
  for v_task in
    select t.run_id, t.flow_slug, t.step_slug, t.task_index, t.queue_name
    from pgflow.step_tasks as t
    join pgflow.runs as r on r.run_id = t.run_id
    where t.status = 'started' and t.permanently_stalled_at is not null and r.status = 'started'
    order by t.run_id, t.step_slug, t.task_index
    for update of t
  loop
    update pgflow.step_tasks as t
    set permanently_stalled_at = null, message_id = (
      select pgmq.send(v_task.queue_name, jsonb_build_object('flow_slug', v_task.flow_slug,
        'run_id', v_task.run_id, 'step_slug', v_task.step_slug, 'task_index', v_task.task_index)))
    where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index;
  end loop;
end;
$$;


-- No engine function runs for PUBLIC (engine 0019). The default privileges 0019 set per schema
-- cannot take away the EXECUTE PostgreSQL grants PUBLIC on every new function, so each migration
-- that creates one revokes it again.
revoke execute on all functions in schema pgflow from public;

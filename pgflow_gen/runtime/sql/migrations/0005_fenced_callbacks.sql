-- Engine migration 0005: callbacks are fenced by attempt.
--
-- A claim starts an attempt of a task (attempts_count goes up by one). pgflow.claim_tasks is the
-- claim that also returns that attempt and the step's effective timeout; the callbacks take the
-- attempt back: complete_task(..., output, attempt), fail_task(..., error_message, attempt),
-- complete_tasks(..., outputs, attempts). A callback whose attempt is no longer the task's current
-- one (the task was retried, or requeued by stall recovery, and claimed again since) changes
-- nothing and returns the task's row unchanged. So a fail_task resent after a lost reply can no
-- longer fail the task's next attempt.
--
-- Rolling upgrade: everything an older worker calls keeps its signature and its behaviour.
-- start_tasks returns the same columns (it is claim_tasks without the two new ones), and the
-- callbacks without an attempt answer whichever attempt is current, as before. Workers of this
-- version need this migration: they refuse to start against an engine without it.

-- What claim_tasks returns for each claimed task: step_task_record's columns, then the attempt
-- this claim started (attempts_count after the claim; callbacks pass it back) and the step's
-- effective timeout in seconds.
create type pgflow.claimed_task as (
  flow_slug text,
  run_id uuid,
  step_slug text,
  input jsonb,
  msg_id bigint,
  task_index int,
  flow_input jsonb,
  attempt int,
  timeout int
);

-- The claim, phase two of reading a task: of the messages a worker read from queue_name, claims the
-- queued tasks of this flow whose run and step are started, extends each message's visibility to
-- the step's timeout + 2 s, and returns the tasks with their inputs, the attempt each claim
-- started (the fencing token of the task's callbacks) and the step's effective timeout.
-- Task rows locked by someone else are skipped (their message comes back later), so a claim never
-- waits; then PGMQ rows are locked. First it archives the queue's batch of completed tasks'
-- messages.
-- The selector follows the flow's queue mode: a step-queued flow claims only tasks of step_slug,
-- which must name a step exactly and queue_name its exact route; a flow-mode flow takes no step.
-- A wrong selector raises before anything changes.
create function pgflow.claim_tasks(
  flow_slug text,
  msg_ids bigint[],
  worker_id uuid,
  queue_name text,
  step_slug text default null
)
returns setof pgflow.claimed_task
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_queue text := lower(queue_name);
  v_mode text;
  v_route text;
  v_twin text;
  v_run_ids uuid[];
  v_step_slugs text[];
  v_task_indexes int[];
  v_message_ids bigint[];
  v_attempts int[];
  v_timeouts int[];
  v_visible_set int;
begin
  if queue_name is null then
    raise exception 'A claim needs the queue the messages were read from.' using errcode = '22004';
  end if;
  select f.queue_mode into v_mode from pgflow.flows as f where f.flow_slug = claim_tasks.flow_slug;
  if not found then
    raise exception 'Flow "%" does not exist.', flow_slug using errcode = 'P0002';
  end if;
  if v_mode = 'flow' and step_slug is not null then
    raise exception 'Flow "%" uses its default queue, so claiming takes no step slug.', flow_slug
      using errcode = '22023', hint = 'Claim without step_slug for a flow-mode flow.';
  end if;
  if v_mode = 'step' then
    if step_slug is null then
      raise exception 'Flow "%" uses per-step queues, so claiming needs the step slug.', flow_slug
        using errcode = '22023', hint = 'Pass step_slug => the step this worker runs, with that step''s queue.';
    end if;
    select s.queue_name into v_route from pgflow.steps as s
    where s.flow_slug = claim_tasks.flow_slug and s.step_slug = claim_tasks.step_slug;
    if not found then
      select s.step_slug into v_twin from pgflow.steps as s
      where s.flow_slug = claim_tasks.flow_slug and lower(s.step_slug) = lower(claim_tasks.step_slug);
      if v_twin is not null then
        raise exception 'Flow "%" has no step "%".', flow_slug, step_slug
          using errcode = '22023', detail = format('Step slugs match exactly; did you mean "%s"?', v_twin);
      end if;
      raise exception 'Flow "%" has no step "%".', flow_slug, step_slug using errcode = '22023';
    end if;
    if v_route <> queue_name then
      raise exception 'Step "%" of flow "%" is routed to queue "%", not "%".', step_slug, flow_slug, v_route, queue_name
        using errcode = '22023', hint = 'Claim with the messages read from the step''s own queue.';
    end if;
    v_queue := v_route;
  end if;
  if msg_ids is null or cardinality(msg_ids) = 0 then
    return;
  end if;
  if not exists (select 1 from pgflow.workers as w where w.worker_id = claim_tasks.worker_id) then
    raise exception 'Worker % is not registered.', worker_id
      using errcode = 'P0002', hint = 'Register it with pgflow.register_worker() before claiming.';
  end if;
  perform pgflow.archive_completed_messages(v_queue);

  -- GUARD: only queued tasks are claimed (a queued task always belongs to a started run and step:
  -- failing a run cancels its tasks, skipping a step skips them); the task row lock decides races.
  with candidates as (
    select t.run_id, t.step_slug, t.task_index
    from pgflow.step_tasks as t
    where t.queue_name = v_queue and t.message_id = any (claim_tasks.msg_ids)
      and t.flow_slug = claim_tasks.flow_slug and t.status = 'queued'
      and (claim_tasks.step_slug is null or t.step_slug = claim_tasks.step_slug)
    order by t.run_id, t.step_slug, t.task_index
    for update skip locked
  ),
  claimed as (
    update pgflow.step_tasks as t
    set status = 'started', attempts_count = t.attempts_count + 1,
      started_at = clock_timestamp(), last_worker_id = claim_tasks.worker_id
    from candidates as c, pgflow.steps as s, pgflow.flows as f
    where t.run_id = c.run_id and t.step_slug = c.step_slug and t.task_index = c.task_index
      and s.flow_slug = t.flow_slug and s.step_slug = t.step_slug and f.flow_slug = t.flow_slug
    returning t.run_id, t.step_slug, t.task_index, t.message_id, t.attempts_count,
      coalesce(s.opt_timeout, f.opt_timeout) as timeout
  )
  select array_agg(c.run_id), array_agg(c.step_slug), array_agg(c.task_index),
    array_agg(c.message_id), array_agg(c.attempts_count), array_agg(c.timeout)
  into v_run_ids, v_step_slugs, v_task_indexes, v_message_ids, v_attempts, v_timeouts
  from claimed as c;
  if v_message_ids is null then
    return;
  end if;

  -- GUARD: the lease must be in place before any task is returned, or the claim is undone.
  select count(*) into v_visible_set from pgflow.set_vt_batch(v_queue, v_message_ids,
    array(select x.t + 2 from unnest(v_timeouts) with ordinality as x (t, n) order by x.n));
  if v_visible_set <> cardinality(v_message_ids) then
    raise exception 'claim_tasks: % of % claimed messages are missing from queue "%".',
      cardinality(v_message_ids) - v_visible_set, cardinality(v_message_ids), v_queue
      using hint = 'Messages of pgflow queues must only be archived or deleted by pgflow.';
  end if;

  return query
  select claim_tasks.flow_slug, c.run_id, c.step_slug,
    case
      when s.step_type = 'map' and s.deps_count = 0 then r.input -> c.task_index
      when s.step_type = 'map' then (
        select dep.output -> c.task_index
        from pgflow.deps as d
        join pgflow.step_states as dep on dep.run_id = c.run_id and dep.step_slug = d.dep_slug
        where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug
      )
      else coalesce((
        select jsonb_object_agg(d.dep_slug, dep.output)
        from pgflow.deps as d
        join pgflow.step_states as dep on dep.run_id = c.run_id and dep.step_slug = d.dep_slug
        where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug and dep.status = 'completed'
      ), '{}'::jsonb)
    end,
    c.message_id, c.task_index,
    case when s.step_type = 'single' and s.deps_count = 0 then r.input end,
    c.attempt, c.timeout
  from unnest(v_run_ids, v_step_slugs, v_task_indexes, v_message_ids, v_attempts, v_timeouts)
    as c (run_id, step_slug, task_index, message_id, attempt, timeout)
  join pgflow.runs as r on r.run_id = c.run_id
  join pgflow.steps as s on s.flow_slug = claim_tasks.flow_slug and s.step_slug = c.step_slug
  order by c.message_id;
end;
$$;

-- The claim as engines before 0005 offered it (workers of those versions call it): claim_tasks
-- without the attempt and timeout columns. Same checks, same effects.
create or replace function pgflow.start_tasks(
  flow_slug text,
  msg_ids bigint[],
  worker_id uuid,
  queue_name text,
  step_slug text default null
)
returns setof pgflow.step_task_record
language sql
volatile
set search_path = ''
as $$
  select c.flow_slug, c.run_id, c.step_slug, c.input, c.msg_id, c.task_index, c.flow_input
  from pgflow.claim_tasks(
    start_tasks.flow_slug, start_tasks.msg_ids, start_tasks.worker_id, start_tasks.queue_name,
    start_tasks.step_slug
  ) as c;
$$;

-- A worker reports a task's output. The last task of a step completes the step (a map's output
-- is its task outputs in task order), which readies children and may complete the run.
-- Late callbacks (run finished, step closed, task not started) change nothing, and so does a
-- stale one: `attempt` (from claim_tasks) is not the task's current attempt. Either returns the
-- task's row unchanged; a stale one's attempts_count differs from `attempt`.
-- Locks run, step state and task (in that order, in one statement); its message is archived in a
-- later batch (pgflow.archivable_messages), so this hot path never waits for a PGMQ row.
create function pgflow.complete_task(run_id uuid, step_slug text, task_index int, output jsonb, attempt int)
returns setof pgflow.step_tasks
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_locked record;
  v_task pgflow.step_tasks;
  v_output_type text := coalesce(jsonb_typeof(output), 'SQL NULL');
begin
  select r.status as run_status, ss.status as step_status, ss.remaining_tasks, s.step_type, t as task,
    -- The first map step fed by this single step, if any (its output must then be an array).
    (select c.step_slug from pgflow.deps as d
     join pgflow.steps as c on c.flow_slug = d.flow_slug and c.step_slug = d.step_slug
     where s.step_type = 'single' and d.flow_slug = s.flow_slug and d.dep_slug = s.step_slug
       and c.step_type = 'map'
     order by c.step_index limit 1) as map_child
  into v_locked
  from pgflow.runs as r
  join pgflow.step_states as ss on ss.run_id = r.run_id and ss.step_slug = complete_task.step_slug
  join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
  join pgflow.step_tasks as t
    on t.run_id = r.run_id and t.step_slug = ss.step_slug and t.task_index = complete_task.task_index
  where r.run_id = complete_task.run_id
  for update of r, ss, t;
  if not found then
    if not exists (select 1 from pgflow.runs as r where r.run_id = complete_task.run_id) then
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

  -- GUARD: late callbacks are no-ops.
  if v_locked.run_status <> 'started' or v_locked.step_status <> 'started' or v_task.status <> 'started' then
    return next v_task;
    return;
  end if;

  -- GUARD: a single step that feeds a map must produce an array; anything else fails the run.
  if v_locked.map_child is not null and v_output_type <> 'array' then
    update pgflow.step_tasks as t
    set status = 'failed', output = complete_task.output, failed_at = clock_timestamp(),
      error_message = format('[TYPE_VIOLATION] Produced %s instead of array', v_output_type)
    where t.run_id = complete_task.run_id and t.step_slug = complete_task.step_slug
      and t.task_index = complete_task.task_index
    returning * into v_task;
    update pgflow.step_states as ss
    set status = 'failed', failed_at = clock_timestamp(), remaining_tasks = null,
      error_message = format('[TYPE_VIOLATION] Map step %s expects array input but dependency %s produced %s',
        v_locked.map_child, complete_task.step_slug, v_output_type)
    where ss.run_id = complete_task.run_id and ss.step_slug = complete_task.step_slug;
    perform pgflow._emit_event(run_id, 'step:failed', step_slug, 'failed');
    perform pgflow._fail_run(run_id);
    perform pgmq.archive(v_task.queue_name, v_task.message_id);
    return next v_task;
    return;
  end if;

  update pgflow.step_tasks as t
  set status = 'completed', output = complete_task.output, completed_at = clock_timestamp()
  where t.run_id = complete_task.run_id and t.step_slug = complete_task.step_slug
    and t.task_index = complete_task.task_index
  returning * into v_task;

  if v_locked.remaining_tasks > 1 then
    update pgflow.step_states as ss set remaining_tasks = ss.remaining_tasks - 1
    where ss.run_id = complete_task.run_id and ss.step_slug = complete_task.step_slug;
  elsif pgflow._complete_step(run_id, step_slug,
      case when v_locked.step_type = 'map' then (
        select jsonb_agg(t.output order by t.task_index)
        from pgflow.step_tasks as t
        where t.run_id = complete_task.run_id and t.step_slug = complete_task.step_slug
      ) else output end) then
    perform pgflow._advance_run(run_id);
  end if;

  -- The message is archived later, in a batch (see pgflow.archivable_messages).
  insert into pgflow.archivable_messages (queue_name, message_id)
  values (v_task.queue_name, v_task.message_id)
  on conflict do nothing;
  return next v_task;
end;
$$;

-- A worker reports a task's failure. With attempts left the task is queued again and its message
-- hidden for base_delay * 2^attempts seconds; exhausted (or parked by stall recovery),
-- when_exhausted decides: fail the run, skip the step, or skip it and everything downstream.
-- Locks run, step state and task (in that order, in one statement), then PGMQ rows.
-- Late callbacks change nothing, and so does a stale one (`attempt`, from claim_tasks, is not the
-- task's current attempt): the task's row comes back unchanged, a stale one's attempts_count
-- differing from `attempt`.
create function pgflow.fail_task(run_id uuid, step_slug text, task_index int, error_message text, attempt int)
returns setof pgflow.step_tasks
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_locked record;
  v_step record;
  v_task pgflow.step_tasks;
  v_delayed int;
begin
  select r.status as run_status, t as task into v_locked
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

  select ss.status, s.when_exhausted,
    coalesce(s.opt_max_attempts, f.opt_max_attempts) as max_attempts,
    coalesce(s.opt_base_delay, f.opt_base_delay) as base_delay
  into v_step
  from pgflow.step_states as ss
  join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
  join pgflow.flows as f on f.flow_slug = ss.flow_slug
  where ss.run_id = fail_task.run_id and ss.step_slug = fail_task.step_slug;

  -- GUARD: late callbacks are no-ops (cancellation and skips win).
  if v_locked.run_status <> 'started' or v_task.status <> 'started' or v_step.status <> 'started' then
    return next v_task;
    return;
  end if;

  -- A parked task's message is gone: it cannot be retried, so its failure is final. So is the
  -- failure of a task whose message someone removed (nothing could deliver the retry).
  if v_task.attempts_count < v_step.max_attempts and v_task.permanently_stalled_at is null then
    select count(*) into v_delayed from pgflow.set_vt_batch(v_task.queue_name, array[v_task.message_id],
      array[pgflow.calculate_retry_delay(v_step.base_delay, v_task.attempts_count)]);
    if v_delayed = 1 then
      update pgflow.step_tasks as t
      set status = 'queued', started_at = null, error_message = fail_task.error_message
      where t.run_id = fail_task.run_id and t.step_slug = fail_task.step_slug and t.task_index = fail_task.task_index
      returning * into v_task;
      return next v_task;
      return;
    end if;
  end if;

  update pgflow.step_tasks as t
  set status = 'failed', failed_at = clock_timestamp(), error_message = fail_task.error_message
  where t.run_id = fail_task.run_id and t.step_slug = fail_task.step_slug and t.task_index = fail_task.task_index
  returning * into v_task;

  if v_step.when_exhausted = 'fail' then
    update pgflow.step_states as ss
    set status = 'failed', failed_at = clock_timestamp(), remaining_tasks = null,
      error_message = fail_task.error_message
    where ss.run_id = fail_task.run_id and ss.step_slug = fail_task.step_slug;
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
  return next v_task;
end;
$$;

-- Completes a batch of tasks in one call, as complete_task would one after another (a worker
-- reports the results it collected together). Returns each task's row afterwards, in input order.
--
-- The common case is done set-based, a handful of statements for the whole batch: a started task
-- of a single step whose children are all plain single steps (no condition, not a map). Its step
-- completes, every child whose last dependency finished starts (one message insert per queue for
-- the batch), the tasks' messages are archived (one call per queue), and runs with no step left
-- complete. Every other task (a map task, a step with a conditional or map child, a late
-- callback of a finished run) goes through complete_task, after the set-based ones, in input
-- order; so does a batch that names a task twice, and a batch of one (complete_task is cheaper
-- for a single task). `attempts` fences each result as complete_task's `attempt` does: a stale
-- one changes nothing and its row comes back unchanged.
--
-- A task that does not exist raises complete_task's error and changes nothing. Locks every run,
-- step state and task of the batch first, in key order, so concurrent batches cannot deadlock.
-- The rows locked are updated by their row ids (ctid; stable while we hold the lock), and the
-- planner settings keep every plan index-driven: these tables grow from empty faster than
-- autovacuum analyses them, and a sequential scan per batch would grow with them.
create function pgflow.complete_tasks(
  run_ids uuid[], step_slugs text[], task_indexes int[], outputs jsonb[], attempts int[]
)
returns setof pgflow.step_tasks
language plpgsql
volatile
set search_path = ''
set enable_seqscan = off
set plan_cache_mode = force_generic_plan
as $$
declare
  v_count int := coalesce(cardinality(run_ids), 0);
  v_batch record;
  v_started record;
  v_missing record;
  v_queue text;
  v_finished uuid[];
  v_general int[];
  v_attempts int[];
  i int;
begin
  if coalesce(cardinality(step_slugs), 0) <> v_count or coalesce(cardinality(task_indexes), 0) <> v_count
    or coalesce(cardinality(outputs), 0) <> v_count
    or (attempts is not null and coalesce(cardinality(attempts), 0) <> v_count) then
    raise exception 'complete_tasks needs arrays of one length (got % run ids, % step slugs, % task indexes, % outputs, % attempts).',
      v_count, coalesce(cardinality(step_slugs), 0), coalesce(cardinality(task_indexes), 0),
      coalesce(cardinality(outputs), 0), coalesce(cardinality(attempts), v_count)
      using errcode = '22023';
  end if;
  if v_count = 0 then
    return;
  end if;
  -- Elements are paired by position, and the general path indexes them from 1.
  if array_ndims(run_ids) <> 1 or array_lower(run_ids, 1) <> 1
    or array_ndims(step_slugs) <> 1 or array_lower(step_slugs, 1) <> 1
    or array_ndims(task_indexes) <> 1 or array_lower(task_indexes, 1) <> 1
    or array_ndims(outputs) <> 1 or array_lower(outputs, 1) <> 1
    or (attempts is not null and (array_ndims(attempts) <> 1 or array_lower(attempts, 1) <> 1)) then
    raise exception 'complete_tasks needs one-dimensional arrays that start at index 1.'
      using errcode = '22023';
  end if;
  -- A null attempts array answers whichever attempts are current, as null elements do.
  v_attempts := coalesce(attempts, array_fill(null::int, array[v_count]));
  if v_count = 1 then
    return query select * from pgflow.complete_task(run_ids[1], step_slugs[1], task_indexes[1], outputs[1],
      v_attempts[1]);
    return;
  end if;

  with locked as (
    select u.ord, u.output, r.run_id, ss.flow_slug, ss.step_slug, t.task_index,
      t.ctid as task_row, ss.ctid as state_row,
      r.status = 'started' and ss.status = 'started' and t.status = 'started'
        and (u.attempt is null or u.attempt = t.attempts_count) as live,
      s.step_type = 'single' and not exists (
        select 1 from pgflow.deps as d
        join pgflow.steps as c on c.flow_slug = d.flow_slug and c.step_slug = d.step_slug
        where d.flow_slug = s.flow_slug and d.dep_slug = s.step_slug
          and (c.step_type <> 'single' or c.required_input_pattern is not null
            or c.forbidden_input_pattern is not null)
      ) as plain
    from unnest(run_ids, step_slugs, task_indexes, outputs, v_attempts) with ordinality
      as u (run_id, step_slug, task_index, output, attempt, ord)
    join pgflow.runs as r on r.run_id = u.run_id
    join pgflow.step_states as ss on ss.run_id = u.run_id and ss.step_slug = u.step_slug
    join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    join pgflow.step_tasks as t
      on t.run_id = u.run_id and t.step_slug = u.step_slug and t.task_index = u.task_index
    order by r.run_id, ss.step_slug, t.task_index
    for update of r, ss, t
  )
  select count(*) as found,
    count(distinct (l.run_id, l.step_slug, l.task_index)) as distinct_found,
    array_agg(l.ord order by l.ord) filter (where l.live and l.plain) as positions,
    array_agg(l.run_id order by l.ord) filter (where l.live and l.plain) as run_ids,
    array_agg(l.flow_slug order by l.ord) filter (where l.live and l.plain) as flow_slugs,
    array_agg(l.step_slug order by l.ord) filter (where l.live and l.plain) as step_slugs,
    array_agg(l.output order by l.ord) filter (where l.live and l.plain) as outputs,
    array_agg(l.task_row order by l.ord) filter (where l.live and l.plain) as task_rows,
    array_agg(l.state_row order by l.ord) filter (where l.live and l.plain) as state_rows,
    array_agg(l.ord order by l.ord) filter (where l.live and not l.plain) as general
  into v_batch
  from locked as l;

  -- GUARD: every task must exist; the error names the first missing one, as complete_task would.
  if v_batch.found < v_count then
    select u.run_id, u.step_slug, u.task_index into v_missing
    from unnest(run_ids, step_slugs, task_indexes) with ordinality as u (run_id, step_slug, task_index, ord)
    where not exists (
      select 1 from pgflow.step_tasks as t
      where t.run_id = u.run_id and t.step_slug = u.step_slug and t.task_index = u.task_index
    )
    order by u.ord
    limit 1;
    if not exists (select 1 from pgflow.runs as r where r.run_id = v_missing.run_id) then
      raise exception 'Run % does not exist.', v_missing.run_id using errcode = 'P0002';
    end if;
    raise exception 'Task % of step "%" in run % does not exist.', v_missing.task_index,
      v_missing.step_slug, v_missing.run_id using errcode = 'P0002';
  end if;

  -- GUARD: a task named twice is completed once, by the general path (the repeat is a late
  -- callback there).
  if v_batch.distinct_found < v_count then
    v_general := array(select generate_series(1, v_count));
  else
    v_general := v_batch.general;
  end if;

  if v_batch.positions is not null and v_batch.distinct_found = v_count then
    -- Tasks, their steps, the children's dependency counts (a child whose last dependencies
    -- all finish in this batch starts once) and the runs' step counts, in one statement.
    with fast as (
      select f.*
      from unnest(v_batch.positions, v_batch.run_ids, v_batch.flow_slugs, v_batch.step_slugs,
        v_batch.outputs, v_batch.task_rows, v_batch.state_rows)
        as f (position, run_id, flow_slug, step_slug, output, task_row, state_row)
    ),
    done as (
      update pgflow.step_tasks as t
      set status = 'completed', output = f.output, completed_at = clock_timestamp()
      from fast as f
      where t.ctid = any (v_batch.task_rows) and t.ctid = f.task_row
      returning t.queue_name, t.message_id
    ),
    closed as (
      update pgflow.step_states as ss
      set status = 'completed', output = f.output, remaining_tasks = 0, completed_at = clock_timestamp()
      from fast as f
      where ss.ctid = any (v_batch.state_rows) and ss.ctid = f.state_row
    ),
    edges as (
      -- last: the batch position of the child's last finishing parent (where its start belongs).
      select f.run_id, d.step_slug, count(*)::int as finished, max(f.position) as last
      from fast as f
      join pgflow.deps as d on d.flow_slug = f.flow_slug and d.dep_slug = f.step_slug
      group by f.run_id, d.step_slug
    ),
    children as (
      update pgflow.step_states as c
      set remaining_deps = c.remaining_deps - e.finished,
        status = case when c.remaining_deps = e.finished then 'started' else c.status end,
        started_at = case when c.remaining_deps = e.finished then clock_timestamp() else c.started_at end,
        remaining_tasks = case when c.remaining_deps = e.finished then c.initial_tasks else c.remaining_tasks end
      from edges as e
      where c.run_id = e.run_id and c.step_slug = e.step_slug and c.status = 'created'
      returning c.run_id, c.flow_slug, c.step_slug, c.remaining_deps, e.last
    ),
    counted as (
      update pgflow.runs as r set remaining_steps = r.remaining_steps - n.finished
      from (select f.run_id, count(*)::int as finished from fast as f group by f.run_id) as n
      where r.run_id = n.run_id
      returning r.run_id, r.remaining_steps
    )
    select array_agg(c.run_id order by c.run_id, s.step_index) as run_ids,
      array_agg(c.flow_slug order by c.run_id, s.step_index) as flow_slugs,
      array_agg(c.step_slug order by c.run_id, s.step_index) as step_slugs,
      array_agg(s.queue_name order by c.run_id, s.step_index) as queue_names,
      array_agg(coalesce(s.opt_start_delay, 0) order by c.run_id, s.step_index) as delays,
      array_agg(c.last order by c.run_id, s.step_index) as positions,
      array_agg(s.step_index order by c.run_id, s.step_index) as step_indexes,
      (select array_agg(n.run_id) from counted as n where n.remaining_steps = 0) as finished_runs,
      (select array_agg(d.queue_name order by d.message_id) from done as d) as done_queues,
      (select array_agg(d.message_id order by d.message_id) from done as d) as done_messages
    into v_started
    from children as c
    join pgflow.steps as s on s.flow_slug = c.flow_slug and s.step_slug = c.step_slug
    where c.remaining_deps = 0;

    -- One message per started child (a single step has one task), one insert per queue; the
    -- task rows are paired with their messages by the task key the message carries.
    for v_queue in select distinct q.name from unnest(v_started.queue_names) as q (name) order by 1 loop
      execute format(
        $q$
          with sent as (
            insert into pgmq.%I (vt, message)
            select clock_timestamp() + make_interval(secs => x.delay),
              jsonb_build_object('flow_slug', x.flow_slug, 'run_id', x.run_id, 'step_slug', x.step_slug, 'task_index', 0)
            from unnest($1::uuid[], $2::text[], $3::text[], $4::int[], $5::text[])
              as x (run_id, flow_slug, step_slug, delay, queue_name)
            where x.queue_name = $6
            returning msg_id, message
          )
          insert into pgflow.step_tasks (run_id, flow_slug, step_slug, task_index, message_id, queue_name)
          select (s.message ->> 'run_id')::uuid, s.message ->> 'flow_slug', s.message ->> 'step_slug', 0,
            s.msg_id, $6
          from sent as s
        $q$,
        'q_' || v_queue
      )
      using v_started.run_ids, v_started.flow_slugs, v_started.step_slugs, v_started.delays,
        v_started.queue_names, v_queue;
    end loop;

    -- The completed tasks' messages are archived at once, one call per queue (a single task's
    -- completion leaves its message to the next claim's batch, see pgflow.archivable_messages).
    for v_queue in select distinct q.name from unnest(v_started.done_queues) as q (name) order by 1 loop
      perform pgmq.archive(v_queue, array(
        select m.message_id from unnest(v_started.done_queues, v_started.done_messages) as m (queue_name, message_id)
        where m.queue_name = v_queue));
    end loop;

    -- The events pgflow._emit_event would send, in one statement, and on each run's channel in
    -- the order completing these tasks one by one would send them: a completion, then the
    -- starts it caused.
    perform pg_notify(
      'pgflow_run_' || replace(e.run_id::text, '-', ''),
      json_build_object('event', e.event, 'run_id', e.run_id, 'step_slug', e.step_slug, 'status', e.status)::text
    )
    from (
      select f.position, 1 as phase, 0 as step_index, f.run_id, 'step:completed' as event, f.step_slug,
        'completed' as status
      from unnest(v_batch.positions, v_batch.run_ids, v_batch.step_slugs) as f (position, run_id, step_slug)
      union all
      select c.position, 2, c.step_index, c.run_id, 'step:started', c.step_slug, 'started'
      from unnest(v_started.positions, v_started.step_indexes, v_started.run_ids, v_started.step_slugs)
        as c (position, step_index, run_id, step_slug)
    ) as e
    order by e.position, e.phase, e.step_index;

    -- Runs with no step left complete, as pgflow._maybe_complete_run does for one.
    if v_started.finished_runs is not null then
      with finished as (
        update pgflow.runs as r
        set status = 'completed', completed_at = clock_timestamp(), output = (
          select jsonb_object_agg(ss.step_slug, ss.output)
          from pgflow.step_states as ss
          where ss.run_id = r.run_id and ss.status = 'completed'
            and not exists (
              select 1 from pgflow.deps as d where d.flow_slug = ss.flow_slug and d.dep_slug = ss.step_slug
            )
        )
        where r.run_id = any (v_started.finished_runs) and r.status = 'started' and r.remaining_steps = 0
        returning r.run_id
      )
      select array_agg(f.run_id order by f.run_id) into v_finished from finished as f;
      perform pg_notify(
        'pgflow_run_' || replace(f.run_id::text, '-', ''),
        json_build_object('event', 'run:completed', 'run_id', f.run_id, 'step_slug', null, 'status', 'completed')::text
      )
      from unnest(v_finished) as f (run_id);
    end if;
  end if;

  if v_general is not null then
    foreach i in array v_general loop
      perform pgflow.complete_task(run_ids[i], step_slugs[i], task_indexes[i], outputs[i], v_attempts[i]);
    end loop;
  end if;

  return query
  select t.*
  from unnest(run_ids, step_slugs, task_indexes) with ordinality as u (run_id, step_slug, task_index, ord)
  join pgflow.step_tasks as t
    on t.run_id = u.run_id and t.step_slug = u.step_slug and t.task_index = u.task_index
  order by u.ord;
end;
$$;

-- The callback without an attempt, as engines before 0005 offered it (their workers call it):
-- answers whichever attempt is current.
create or replace function pgflow.complete_task(run_id uuid, step_slug text, task_index int, output jsonb)
returns setof pgflow.step_tasks
language sql
volatile
set search_path = ''
as $$
  select * from pgflow.complete_task($1, $2, $3, $4, null);
$$;

-- The callback without an attempt, as engines before 0005 offered it (their workers call it):
-- answers whichever attempt is current, so a resent failure can fail a later attempt.
create or replace function pgflow.fail_task(run_id uuid, step_slug text, task_index int, error_message text)
returns setof pgflow.step_tasks
language sql
volatile
set search_path = ''
as $$
  select * from pgflow.fail_task($1, $2, $3, $4, null);
$$;

-- The batch without attempts, as engines before 0005 offered it (their workers call it): answers
-- whichever attempts are current.
create or replace function pgflow.complete_tasks(run_ids uuid[], step_slugs text[], task_indexes int[], outputs jsonb[])
returns setof pgflow.step_tasks
language sql
volatile
set search_path = ''
as $$
  select * from pgflow.complete_tasks($1, $2, $3, $4, null);
$$;

-- Engine migration 0008: one liveness rule, stall recovery that never takes a live claim, no
-- message redelivered for ever, and options that follow the spec.
--
-- pgflow.worker_liveness() is the one place in SQL that spells the worker liveness rule
-- (heartbeat every 5 s, live within 15 s, stalled after 30 s; pgflow.heartbeat_interval,
-- pgflow.live_within and pgflow.stalled_after override them per database). queue_coverage
-- defaults to its live_within and find_stalled_tasks, the stall rule, to its stalled_after.
-- requeue_stalled_tasks locks its candidates in one statement and re-checks them in the next, with
-- a fresh snapshot: a task claimed a moment earlier by a worker that registered after the first
-- statement began was requeued before. claim_tasks registers a worker again that is marked stopped
-- or silent for longer than live_within, so its claim is not taken the moment it is made. Workers
-- of any release run on it.
--
-- prune_data_older_than deletes the queued messages of the tasks it deletes; claim_tasks archives
-- a message of its flow (and step) whose task no longer exists, with a warning naming them, so
-- such a message is no longer redelivered after every lease. Other foreign messages are left
-- alone as before.
--
-- ensure_flow_compiled applies a verified shape's options (retries, delays, timeouts: not part of
-- the compared shape) through _apply_flow_options, listing them as "optionsUpdated", and says
-- what a local recompile deleted ("deletedRuns"); "summary" says either for people.
--
-- step_tasks gets claimed_timeout, the timeout an attempt was claimed with: its lease, which the
-- stall rule uses, so an attempt in flight keeps its timeout when the step's changes; and
-- lease_renewed_at, which renew_task_leases sets for the results a live worker holds but cannot
-- send yet (a lock, a slow database), so stall recovery does not run those tasks again.
--
-- pgflow.pgmq_table_name is the one place in SQL that names a queue's PGMQ table ('q_' or 'a_'
-- and the queue name, lower case); set_vt_batch, enqueue_step_tasks, claim_tasks, complete_tasks
-- and prune_data_older_than call it (enqueue_step_tasks did not lower-case the name).

alter table pgflow.step_tasks
  add column claimed_timeout int,
  add column lease_renewed_at timestamptz;

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
set search_path = ''
as $$
declare
  v_renewed int;
begin
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

-- The table PGMQ keeps a queue's messages in (kind 'q') or its archive (kind 'a'), in schema
-- pgmq: lower(kind || '_' || queue_name), as PGMQ names them. The one place in SQL that spells
-- it (pgflow_gen.naming.pgmq_table is its Python twin); every function that reaches a queue's
-- table by name calls it. Pure.
create function pgflow.pgmq_table_name(queue_name text, kind text default 'q')
returns text
language sql
immutable
parallel safe
set search_path = ''
return lower(kind || '_' || queue_name);

-- Sets the visibility of several messages of one queue in one statement (PGMQ has no batched
-- set_vt with per-message offsets). Unknown ids are ignored; callers compare the returned rows.
-- Locks the PGMQ rows it updates: callers must already hold the matching step_tasks rows.
create or replace function pgflow.set_vt_batch(queue_name text, msg_ids bigint[], vt_offsets int[])
returns table (msg_id bigint, vt timestamptz)
language plpgsql
volatile
set search_path = ''
as $$
begin
  if msg_ids is null or cardinality(msg_ids) = 0 then
    return;
  end if;
  if cardinality(msg_ids) <> coalesce(cardinality(vt_offsets), 0) then
    raise exception 'set_vt_batch: % message ids but % offsets',
      cardinality(msg_ids), coalesce(cardinality(vt_offsets), 0);
  end if;
  return query execute format(
    $q$
      update pgmq.%I as q
      set vt = clock_timestamp() + make_interval(secs => v.vt_offset)
      from unnest($1, $2) as v (msg_id, vt_offset)
      -- The redundant "= any" lets the planner use the queue's primary key instead of a scan.
      where q.msg_id = v.msg_id and q.msg_id = any ($1)
      returning q.msg_id, q.vt
    $q$,
    pgflow.pgmq_table_name(queue_name)
  ) using msg_ids, vt_offsets;
end;
$$;

-- Creates a started step's tasks: one message per task index in the step's queue, carrying only
-- the task key, then the task rows that remember each message id (paired through RETURNING, never
-- by row order). The queue table name is dynamic, so its statement is planned on every call and
-- kept as simple as possible (a single-task step, the common case, inserts one row).
create or replace function pgflow._enqueue_step_tasks(
  run_id uuid,
  flow_slug text,
  step_slug text,
  queue_name text,
  task_count int,
  delay_seconds int
)
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_queue_table text := pgflow.pgmq_table_name(queue_name);
  v_message_id bigint;
  v_message_ids bigint[];
  v_task_indexes int[];
begin
  if task_count = 1 then
    execute format('insert into pgmq.%I (vt, message) values ($1, $2) returning msg_id', v_queue_table)
    into v_message_id
    using clock_timestamp() + make_interval(secs => delay_seconds),
      jsonb_build_object('flow_slug', flow_slug, 'run_id', run_id, 'step_slug', step_slug, 'task_index', 0);
    insert into pgflow.step_tasks (run_id, flow_slug, step_slug, task_index, message_id, queue_name)
    values (run_id, flow_slug, step_slug, 0, v_message_id, queue_name);
    return;
  end if;

  execute format(
    $q$
      with sent as (
        insert into pgmq.%I (vt, message)
        select $1, jsonb_build_object('flow_slug', $2, 'run_id', $3, 'step_slug', $4, 'task_index', i)
        from generate_series(0, $5 - 1) as i
        returning msg_id, (message ->> 'task_index')::int as task_index
      )
      select array_agg(msg_id), array_agg(task_index) from sent
    $q$,
    v_queue_table
  )
  into v_message_ids, v_task_indexes
  using clock_timestamp() + make_interval(secs => delay_seconds), flow_slug, run_id, step_slug, task_count;
  insert into pgflow.step_tasks (run_id, flow_slug, step_slug, task_index, message_id, queue_name)
  select _enqueue_step_tasks.run_id, _enqueue_step_tasks.flow_slug, _enqueue_step_tasks.step_slug,
    m.task_index, m.message_id, _enqueue_step_tasks.queue_name
  from unnest(v_task_indexes, v_message_ids) as m (task_index, message_id);
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
create or replace function pgflow.complete_tasks(
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
        pgflow.pgmq_table_name(v_queue)
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

-- The worker liveness rule, the one place in SQL that spells it: workers heartbeat every
-- heartbeat_interval; a worker counts as live (queue_coverage, `pgflow-gen workers`) while its
-- heartbeat is younger than live_within, and its tasks count as stalled (requeue_stalled_tasks)
-- once it is older than stalled_after. Defaults 5 s, 15 s and 30 s (pgflow_gen.runtime.liveness
-- is the Python twin); an operator may set pgflow.heartbeat_interval, pgflow.live_within and
-- pgflow.stalled_after per database (every session must see one rule). Workers read it when
-- they start. No writes.
create function pgflow.worker_liveness(
  out heartbeat_interval interval,
  out live_within interval,
  out stalled_after interval
)
language plpgsql
stable
parallel safe
set search_path = ''
as $$
begin
  heartbeat_interval := coalesce(nullif(current_setting('pgflow.heartbeat_interval', true), '')::interval, interval '5 seconds');
  live_within := coalesce(nullif(current_setting('pgflow.live_within', true), '')::interval, interval '15 seconds');
  stalled_after := coalesce(nullif(current_setting('pgflow.stalled_after', true), '')::interval, interval '30 seconds');
  -- GUARD: a live worker must never look stalled: at least two missed heartbeats before either;
  -- and a heartbeat at most ten times a second.
  if not (heartbeat_interval >= interval '0.1 seconds' and live_within >= 2 * heartbeat_interval
          and stalled_after >= live_within) then
    raise exception 'Inconsistent worker liveness settings: heartbeat every %, live within %, stalled after %.',
      heartbeat_interval, live_within, stalled_after
      using errcode = '22023',
        hint = 'Keep pgflow.heartbeat_interval >= 0.1 s, pgflow.live_within >= 2 x the heartbeat interval and pgflow.stalled_after >= pgflow.live_within.';
  end if;
end;
$$;

-- The stall rule, read by requeue_stalled_tasks: the started tasks (of started runs and steps, not
-- parked) whose worker is gone (marked stopped, or no heartbeat within the liveness rule's
-- stalled_after) or whose lease ran out (started, or last renewed by its worker while it holds
-- a result it cannot send yet, longer ago than the timeout it was claimed with + stalled_after:
-- a live worker ends an attempt at its timeout). Takes no locks; sees the calling statement's
-- snapshot.
create function pgflow.find_stalled_tasks()
returns table (run_id uuid, step_slug text, task_index int)
language sql
stable
set search_path = ''
as $$
  select t.run_id, t.step_slug, t.task_index
  from pgflow.worker_liveness() as l,
    pgflow.step_tasks as t
    join pgflow.runs as r on r.run_id = t.run_id and r.status = 'started'
    join pgflow.step_states as ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug and ss.status = 'started'
    join pgflow.steps as s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug
    join pgflow.flows as f on f.flow_slug = t.flow_slug
  where t.status = 'started' and t.permanently_stalled_at is null
    and (
      coalesce(t.lease_renewed_at, t.started_at) < clock_timestamp()
        - make_interval(secs => coalesce(t.claimed_timeout, s.opt_timeout, f.opt_timeout)) - l.stalled_after
      or not exists (
        select 1 from pgflow.workers as w
        where w.worker_id = t.last_worker_id and w.stopped_at is null
          and w.last_heartbeat_at > clock_timestamp() - l.stalled_after
      )
    )
$$;

-- Recovers tasks whose worker vanished: the tasks pgflow.find_stalled_tasks names (worker gone,
-- or lease run out; never a task a live worker runs within its timeout). A stalled task is queued
-- again and its message made visible, at most 3 times; after that it is parked
-- (permanently_stalled_at) and its message archived. Skips locked tasks. Two statements: the
-- first locks the candidates, the second re-checks them with a fresh snapshot, so a task claimed a
-- moment ago by a worker that registered after the first statement began is left alone.
-- Also archives the completed tasks' messages still waiting in pgflow.archivable_messages.
create or replace function pgflow.requeue_stalled_tasks()
returns int
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_requeue_queues text[];
  v_requeue_messages bigint[];
  v_park_queues text[];
  v_park_messages bigint[];
  v_queue text;
  v_ids bigint[];
  v_run_ids uuid[];
  v_step_slugs text[];
  v_task_indexes int[];
begin
  -- Periodic maintenance is also where idle queues get their completed messages archived; first,
  -- before any task row is locked (the drain takes no task locks, so no order to invert).
  perform pgflow.archive_completed_messages();

  -- Lock the candidates (this statement's snapshot may predate a worker that claimed one since).
  select array_agg(x.run_id), array_agg(x.step_slug), array_agg(x.task_index)
  into v_run_ids, v_step_slugs, v_task_indexes
  from (
    select t.run_id, t.step_slug, t.task_index
    from pgflow.find_stalled_tasks() as c
    join pgflow.step_tasks as t
      on t.run_id = c.run_id and t.step_slug = c.step_slug and t.task_index = c.task_index
    for update of t skip locked
  ) as x;
  if v_run_ids is null then
    return 0;
  end if;

  -- GUARD: a new statement, a new snapshot: only the locked tasks that are still stalled change.
  with stalled as (
    select c.run_id, c.step_slug, c.task_index
    from pgflow.find_stalled_tasks() as c
    join unnest(v_run_ids, v_step_slugs, v_task_indexes) as k (run_id, step_slug, task_index)
      on k.run_id = c.run_id and k.step_slug = c.step_slug and k.task_index = c.task_index
  ),
  changed as (
    update pgflow.step_tasks as t
    set status = case when t.requeued_count < 3 then 'queued' else t.status end,
      started_at = case when t.requeued_count < 3 then null else t.started_at end,
      last_worker_id = case when t.requeued_count < 3 then null else t.last_worker_id end,
      requeued_count = case when t.requeued_count < 3 then t.requeued_count + 1 else t.requeued_count end,
      last_requeued_at = case when t.requeued_count < 3 then clock_timestamp() else t.last_requeued_at end,
      permanently_stalled_at = case when t.requeued_count < 3 then null else clock_timestamp() end
    from stalled
    where t.run_id = stalled.run_id and t.step_slug = stalled.step_slug and t.task_index = stalled.task_index
    returning t.queue_name, t.message_id, t.status = 'queued' as requeued
  )
  select array_agg(c.queue_name) filter (where c.requeued), array_agg(c.message_id) filter (where c.requeued),
    array_agg(c.queue_name) filter (where not c.requeued), array_agg(c.message_id) filter (where not c.requeued)
  into v_requeue_queues, v_requeue_messages, v_park_queues, v_park_messages
  from changed as c;

  -- Requeued tasks become visible at once; parked ones leave the queue.
  for v_queue in select distinct q from unnest(v_requeue_queues) as q loop
    v_ids := array(select x.m from unnest(v_requeue_queues, v_requeue_messages) as x (q, m) where x.q = v_queue);
    perform pgflow.set_vt_batch(v_queue, v_ids, array_fill(0, array[cardinality(v_ids)]));
  end loop;
  perform pgflow._archive_task_messages(v_park_queues, v_park_messages);
  return coalesce(cardinality(v_requeue_messages), 0);
end;
$$;

-- The claim, phase two of reading a task: of the messages a worker read from queue_name, claims the
-- queued tasks of this flow whose run and step are started, extends each message's visibility to
-- the step's timeout + 2 s, and returns the tasks with their inputs, the attempt each claim
-- started (the fencing token of the task's callbacks) and the step's effective timeout.
-- Task rows locked by someone else are skipped (their message comes back later), so a claim never
-- waits; then PGMQ rows are locked. First it archives the queue's batch of completed tasks'
-- messages.
-- The selector follows the flow's queue mode: a step-queued flow claims only tasks of step_slug,
-- which must name a step exactly and queue_name its exact route; a flow-mode flow takes no step.
-- A wrong selector raises before anything changes. Messages read of this flow (and step) whose
-- task no longer exists are archived (a warning names them); other foreign ones are left alone.
-- A worker marked stopped, or silent for longer than the liveness rule's live_within, that claims
-- is registered again (a claim proves it alive).
create or replace function pgflow.claim_tasks(
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
  v_orphans bigint[];
  v_stopped_at timestamptz;
  v_heartbeat_at timestamptz;
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
  select w.stopped_at, w.last_heartbeat_at into v_stopped_at, v_heartbeat_at
  from pgflow.workers as w where w.worker_id = claim_tasks.worker_id;
  if not found then
    raise exception 'Worker % is not registered.', worker_id
      using errcode = 'P0002', hint = 'Register it with pgflow.register_worker() before claiming.';
  end if;
  -- GUARD: a claim proves its worker alive. One marked stopped, or silent for longer than the live
  -- window, is registered again, or stall recovery would take what it claims the moment it does.
  if v_stopped_at is not null
     or v_heartbeat_at < clock_timestamp() - (pgflow.worker_liveness()).live_within then
    update pgflow.workers as w set stopped_at = null, last_heartbeat_at = clock_timestamp()
    where w.worker_id = claim_tasks.worker_id;
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
      started_at = clock_timestamp(), last_worker_id = claim_tasks.worker_id,
      claimed_timeout = coalesce(s.opt_timeout, f.opt_timeout), lease_renewed_at = null
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
  -- Messages of this flow (and step) whose task no longer exists (a run deleted or pruned
  -- before 0008 left them) would come back after every lease: archive them and say so. Only
  -- when some message read was not claimed (the common claim takes them all and skips this).
  if cardinality(msg_ids) > coalesce(cardinality(v_message_ids), 0) then
    execute format($sql$
      select array_agg(q.msg_id order by q.msg_id) from pgmq.%I as q
      where q.msg_id = any ($1) and not (q.msg_id = any ($2))
        and q.message ->> 'flow_slug' = $3 and ($4::text is null or q.message ->> 'step_slug' = $4)
        and q.message ->> 'run_id' ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
        and q.message ->> 'task_index' ~ '^[0-9]{1,9}$'
        and not exists (
          select 1 from pgflow.step_tasks as t
          where t.run_id = (case when q.message ->> 'run_id' ~* '^[0-9a-f-]{36}$' then (q.message ->> 'run_id')::uuid end)
            and t.step_slug = q.message ->> 'step_slug'
            and t.task_index = (case when q.message ->> 'task_index' ~ '^[0-9]{1,9}$' then (q.message ->> 'task_index')::int end)
        )
      $sql$, pgflow.pgmq_table_name(v_queue))
    into v_orphans using msg_ids, coalesce(v_message_ids, '{}'), claim_tasks.flow_slug, claim_tasks.step_slug;
  end if;
  if v_orphans is not null then
    perform pgmq.archive(v_queue, v_orphans);
    raise warning 'claim_tasks archived % message(s) of queue "%" whose task no longer exists.',
      cardinality(v_orphans), v_queue
      using detail = jsonb_build_object('archived_message_ids', to_jsonb(v_orphans))::text;
  end if;
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

-- Maintenance: deletes finished runs (completed or failed before now - retention) with their step
-- states, tasks and the tasks' messages still in a queue, workers silent for longer than retention, and archived messages older than
-- retention in every queue a flow owns (its steps' routes, plus the default queue of a flow-mode
-- flow), found by their canonical archive table names without listing queues. Running runs are
-- never touched, whatever their age.
create or replace function pgflow.prune_data_older_than(retention interval)
returns jsonb
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_cutoff timestamptz := now() - retention;
  v_runs uuid[];
  v_queue text;
  v_workers int;
  v_archived int := 0;
  v_count int;
  v_queues text[];
  v_messages bigint[];
begin
  if retention is null or retention < interval '0' then
    raise exception 'Retention must be a non-negative interval, got %.', retention using errcode = '22023';
  end if;

  perform pgflow.archive_completed_messages();

  -- Same lock order as the task callbacks: runs first; a run busy right now is pruned next time.
  v_runs := array(
    select r.run_id from pgflow.runs as r
    where (r.status = 'completed' and r.completed_at < v_cutoff)
       or (r.status = 'failed' and r.failed_at < v_cutoff)
    order by r.run_id
    for update skip locked
  );
  if cardinality(v_runs) = 0 then
    v_runs := null;
  end if;

  if v_runs is not null then
    -- The tasks' messages still in their queues go with them, or they would come back after every
    -- lease with no task to claim (a run failed by hand, a task parked by stall recovery).
    with gone as (
      delete from pgflow.step_tasks as t where t.run_id = any (v_runs)
      returning t.queue_name, t.message_id
    )
    select array_agg(g.queue_name), array_agg(g.message_id) into v_queues, v_messages
    from gone as g where g.message_id is not null;
    for v_queue in select distinct q from unnest(v_queues) as q loop
      continue when to_regclass(format('pgmq.%I', pgflow.pgmq_table_name(v_queue))) is null;
      perform pgmq.delete(v_queue, array(
        select x.m from unnest(v_queues, v_messages) as x (q, m) where x.q = v_queue
      ));
    end loop;
    delete from pgflow.step_states as ss where ss.run_id = any (v_runs);
    delete from pgflow.runs as r where r.run_id = any (v_runs);
  end if;

  delete from pgflow.workers as w where w.last_heartbeat_at < v_cutoff;
  get diagnostics v_workers = row_count;

  for v_queue in
    select s.queue_name from pgflow.steps as s
    union
    select pgflow.default_queue_name(f.flow_slug) from pgflow.flows as f where f.queue_mode = 'flow'
  loop
    continue when to_regclass(format('pgmq.%I', pgflow.pgmq_table_name(v_queue, 'a'))) is null;
    execute format('delete from pgmq.%I where archived_at < $1', pgflow.pgmq_table_name(v_queue, 'a'))
      using v_cutoff;
    get diagnostics v_count = row_count;
    v_archived := v_archived + v_count;
  end loop;

  return jsonb_build_object(
    'runs', coalesce(cardinality(v_runs), 0), 'workers', v_workers, 'archived_messages', v_archived
  );
end;
$$;

-- Which queue routes have a live worker right now: every persisted step route, left-joined to the
-- workers registered on exactly that queue that are neither stopped nor deprecated and sent a
-- heartbeat within `freshness` (default: the liveness rule's live_within, 15 s, three heartbeats).
-- Several live instances are one covered route. A point-in-time check, run after a deployment.
create or replace function pgflow.queue_coverage(freshness interval default (pgflow.worker_liveness()).live_within)
returns table (
  flow_slug text,
  step_slug text,
  step_index int,
  queue_name text,
  live_workers int,
  covered boolean
)
language sql
stable
set search_path = ''
as $$
  select s.flow_slug, s.step_slug, s.step_index, s.queue_name,
    count(w.worker_id)::int, count(w.worker_id) > 0
  from pgflow.steps as s
  left join pgflow.workers as w
    on w.queue_name = s.queue_name
    and w.stopped_at is null
    and w.deprecated_at is null
    and w.last_heartbeat_at > now() - queue_coverage.freshness
  group by s.flow_slug, s.step_slug, s.step_index, s.queue_name
  order by s.flow_slug, s.step_index
$$;

-- Keeps a flow's options (retries, delays, timeouts) in step with the shape it was verified
-- against: options are not part of the compared shape, so an edited spec changes them in place,
-- with no recompile. A shape without top-level "options" (a hand-written one) changes no option,
-- the steps' neither; otherwise a step without an option inherits the flow's. Returns the changes, [{"step": null | slug, "option",
-- "from", "to"}] (null: the flow's default), and notifies them on the channel pgflow_flows. Tasks
-- claimed before keep the timeout of their claim. Called by ensure_flow_compiled under the
-- flow's definition lock.
create function pgflow._apply_flow_options(flow_slug text, shape jsonb)
returns jsonb
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_flow jsonb := shape -> 'options';
  v_changes jsonb;
begin
  if v_flow is null or jsonb_typeof(v_flow) <> 'object' then
    return '[]'::jsonb;
  end if;

  with wanted as (
    -- The flow's options (an option the shape leaves out stays as it is), then every step's.
    select null::text as step_slug, -1 as step_index, o.option, o.ord, o.current, coalesce(o.wanted, o.current) as wanted
    from pgflow.flows as f,
      unnest(
        array['maxAttempts', 'baseDelay', 'timeout'],
        array[f.opt_max_attempts, f.opt_base_delay, f.opt_timeout],
        array[(v_flow ->> 'maxAttempts')::int, (v_flow ->> 'baseDelay')::int, (v_flow ->> 'timeout')::int]
      ) with ordinality as o (option, current, wanted, ord)
    where f.flow_slug = _apply_flow_options.flow_slug
    union all
    select s.step_slug, s.step_index, o.option, o.ord, o.current, o.wanted
    from jsonb_array_elements(shape -> 'steps') as e (step)
    join pgflow.steps as s on s.flow_slug = _apply_flow_options.flow_slug and s.step_slug = e.step ->> 'slug',
      unnest(
        array['maxAttempts', 'baseDelay', 'timeout', 'startDelay'],
        array[s.opt_max_attempts, s.opt_base_delay, s.opt_timeout, s.opt_start_delay],
        array[(e.step #>> '{options,maxAttempts}')::int, (e.step #>> '{options,baseDelay}')::int,
              (e.step #>> '{options,timeout}')::int, (e.step #>> '{options,startDelay}')::int]
      ) with ordinality as o (option, current, wanted, ord)
  )
  select jsonb_agg(jsonb_build_object('step', w.step_slug, 'option', w.option, 'from', w.current, 'to', w.wanted)
      order by w.step_index, w.ord)
  into v_changes
  from wanted as w
  where w.current is distinct from w.wanted;
  if v_changes is null then
    return '[]'::jsonb;
  end if;

  update pgflow.flows as f
  set opt_max_attempts = coalesce((v_flow ->> 'maxAttempts')::int, f.opt_max_attempts),
    opt_base_delay = coalesce((v_flow ->> 'baseDelay')::int, f.opt_base_delay),
    opt_timeout = coalesce((v_flow ->> 'timeout')::int, f.opt_timeout)
  where f.flow_slug = _apply_flow_options.flow_slug;
  update pgflow.steps as s
  set opt_max_attempts = (e.step #>> '{options,maxAttempts}')::int,
    opt_base_delay = (e.step #>> '{options,baseDelay}')::int,
    opt_timeout = (e.step #>> '{options,timeout}')::int,
    opt_start_delay = (e.step #>> '{options,startDelay}')::int
  from jsonb_array_elements(shape -> 'steps') as e (step)
  where s.flow_slug = _apply_flow_options.flow_slug and s.step_slug = e.step ->> 'slug';

  perform pg_notify('pgflow_flows', jsonb_build_object(
    'event', 'flow:options_updated', 'flow_slug', flow_slug, 'changes', v_changes
  )::text);
  return v_changes;
end;
$$;

-- Startup compilation: creates a missing flow from its shape in its queue mode, verifies an
-- existing one (shape, then queue mode and the persisted route of every step), and on a
-- difference recompiles only in a local database (pgflow.local = on), else reports a mismatch of
-- kind "shape" or "routing" and changes nothing. The engine derives the routes itself: a supplied
-- route_map ([{stepSlug, queueName}] in step order) must be exactly the derived one (required in
-- step mode). A shape's "inputSchema" is stored with the flow when it is compiled, recompiled
-- or verified (not compared); its options are applied when it is verified (not compared either:
-- "optionsUpdated" lists the changes). A result may carry a "summary" for people: what changed
-- ("verified; options updated: ...", "recompiled: 6 run(s) deleted").
-- Takes the flow's definition lock; any failure rolls back everything.
create or replace function pgflow.ensure_flow_compiled(
  flow_slug text,
  shape jsonb,
  queue_mode text default 'flow',
  route_map jsonb default null
)
returns jsonb
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_step_slugs text[];
  v_queues text[];
  v_derived jsonb;
  v_persisted jsonb;
  v_mode text;
  v_twin text;
  v_differences text[] := '{}';
  v_routing text[] := '{}';
  v_kind text;
  v_options jsonb;
  v_deleted_runs bigint;
begin
  perform pgflow._validate_flow_shape(shape);
  v_step_slugs := array(select s.value ->> 'slug' from jsonb_array_elements(shape -> 'steps') as s);
  select coalesce(array_agg(r.queue_name order by r.step_index), '{}'),
    coalesce(jsonb_agg(jsonb_build_object('stepSlug', r.step_slug, 'queueName', r.queue_name) order by r.step_index), '[]')
  into v_queues, v_derived
  from pgflow.derive_queue_routes(flow_slug, v_step_slugs, queue_mode) as r;
  perform pgflow._check_route_map(flow_slug, queue_mode, v_derived, route_map);

  perform pgflow._lock_flow_definition(flow_slug);

  select f.flow_slug into v_twin from pgflow.flows as f
  where lower(f.flow_slug) = lower(ensure_flow_compiled.flow_slug) and f.flow_slug <> ensure_flow_compiled.flow_slug;
  if v_twin is not null then
    raise exception 'Flow "%" differs only in case from the existing flow "%".', flow_slug, v_twin
      using errcode = '23505', detail = 'Flow slugs are unique ignoring case.',
        hint = 'Use the existing spelling, or a different flow slug.';
  end if;

  select f.queue_mode into v_mode from pgflow.flows as f where f.flow_slug = ensure_flow_compiled.flow_slug;
  if not found then
    perform pgflow._create_flow_from_shape(flow_slug, shape, queue_mode, v_queues);
    perform pgflow._store_input_schema(flow_slug, shape);
    return jsonb_build_object('status', 'compiled', 'mismatchKind', null, 'differences', '[]'::jsonb);
  end if;

  v_differences := pgflow._compare_flow_shapes(
    pgflow._normalize_flow_shape(shape), pgflow._get_flow_shape(flow_slug)
  );
  if v_mode <> queue_mode then
    v_routing := v_routing || format('Queue mode of flow "%s" differs: expected "%s", persisted "%s"',
      flow_slug, queue_mode, v_mode);
  end if;
  -- Routes are compared even when shape and mode match (a changed resolver or a manual edit); with
  -- a different shape the steps do not line up, and the shape differences say enough.
  v_persisted := pgflow._get_queue_routes(flow_slug);
  if cardinality(v_differences) = 0 and v_persisted <> v_derived then
    v_routing := v_routing || array(
      select format('Route of step "%s" of flow "%s" differs: expected queue "%s", persisted "%s"',
        e.value ->> 'stepSlug', flow_slug, e.value ->> 'queueName', v_persisted -> (e.ordinality - 1)::int ->> 'queueName')
      from jsonb_array_elements(v_derived) with ordinality as e
      where e.value <> v_persisted -> (e.ordinality - 1)::int
      order by e.ordinality
    );
  end if;
  if cardinality(v_differences) = 0 and cardinality(v_routing) = 0 then
    perform pgflow._store_input_schema(flow_slug, shape);
    v_options := pgflow._apply_flow_options(flow_slug, shape);
    if jsonb_array_length(v_options) = 0 then
      return jsonb_build_object('status', 'verified', 'mismatchKind', null, 'differences', '[]'::jsonb);
    end if;
    return jsonb_build_object('status', 'verified', 'mismatchKind', null, 'differences', '[]'::jsonb,
      'optionsUpdated', v_options,
      'summary', 'verified; options updated: ' || (
        select string_agg(format('%s %s %s -> %s',
            case when c ->> 'step' is null then 'flow' else format('step "%s"', c ->> 'step') end,
            c ->> 'option', coalesce(c ->> 'from', 'the flow''s'), coalesce(c ->> 'to', 'the flow''s')),
          ', ' order by o)
        from jsonb_array_elements(v_options) with ordinality as x (c, o)
      ));
  end if;
  v_kind := case when cardinality(v_differences) > 0 then 'shape' else 'routing' end;
  v_differences := v_differences || v_routing;

  if coalesce(current_setting('pgflow.local', true), '') = 'on' then
    -- The new queues must be free before the old definition goes (its own queues count as free).
    perform pgflow._preflight_queue_names(flow_slug,
      case when queue_mode = 'flow' then array[pgflow.default_queue_name(flow_slug)] else v_queues end);
    select count(*) into v_deleted_runs from pgflow.runs as r where r.flow_slug = ensure_flow_compiled.flow_slug;
    perform pgflow.delete_flow_and_data(flow_slug);
    perform pgflow._create_flow_from_shape(flow_slug, shape, queue_mode, v_queues);
    perform pgflow._store_input_schema(flow_slug, shape);
    return jsonb_build_object('status', 'recompiled', 'mismatchKind', v_kind,
      'differences', to_jsonb(v_differences), 'deletedRuns', v_deleted_runs,
      'summary', format('recompiled: %s run(s) deleted', v_deleted_runs));
  end if;
  return jsonb_build_object('status', 'mismatch', 'mismatchKind', v_kind,
    'differences', to_jsonb(v_differences));
end;
$$;

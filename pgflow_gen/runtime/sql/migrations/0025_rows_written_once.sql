-- Engine migration 0025: rows written once, and a completed task's message deleted.
--
-- A one-step run wrote 13 row versions (5 inserts, 7 updates, 1 delete) where raw PGMQ writes 4
-- per message; each update leaves a dead version for vacuum (benchmarks/writes.py). Now:
-- - start_flow writes the root steps started when they are all plain single steps (no
--   condition), as start_flows does, instead of writing them created and then updating them;
-- - pgflow._complete_step starts a child whose last dependency finished in the statement that
--   counts it down, when every child of the step is a plain single step (no condition, no
--   concurrency key), as complete_tasks does for a batch;
-- - the statement that counts a run's last step off completes the run (pgflow._complete_step for
--   one task, complete_tasks for a batch), instead of a second update;
-- - complete_task and complete_tasks delete a completed task's message instead of archiving it:
--   the task row records the completion. pgflow.finished_tasks (the dashboard's and the metrics'
--   counts) reads completions from step_tasks through a new BRIN index on completed_at (HOT-safe
--   on PostgreSQL 16 and later) and the rest from the archives, each task once.
-- One-step run: 13 -> 10 row versions, 8 -> 6 dead, 1,450-1,600 -> 1,200-1,300 bytes of table
-- growth; 3-step chain: 24 -> 20 dead. Events, their order and the final rows are unchanged.

-- BEGIN HAND-WRITTEN: tables and data, applied before the functions below.
create index step_tasks_completed_at_idx on pgflow.step_tasks using brin (completed_at)
  with (autosummarize = on);
-- END HAND-WRITTEN

-- Written by `make migration` from pgflow_gen/runtime/sql/source/: edit the source, then
-- write the migration again; only the header and the hand-written section above are kept.

-- pgflow._complete_step: source/0122_function_complete_step.sql
create or replace function pgflow._complete_step(run_id uuid, step_slug text, output jsonb)
returns boolean
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_array_length int := case when jsonb_typeof(output) = 'array' then jsonb_array_length(output) end;
  v_flow_slug text;
  v_children record;
  v_run record;
begin
  update pgflow.step_states as ss
  set status = 'completed', output = _complete_step.output, remaining_tasks = 0,
    started_at = coalesce(ss.started_at, clock_timestamp()), completed_at = clock_timestamp()
  where ss.run_id = _complete_step.run_id and ss.step_slug = _complete_step.step_slug
    and ss.status in ('created', 'started')
  returning ss.flow_slug into v_flow_slug;
  if not found then
    return false;
  end if;
  perform pgflow._emit_event(run_id, 'step:completed', step_slug, 'completed');

  with waiting as (
    select s.step_slug, s.step_index, s.queue_name, coalesce(s.opt_start_delay, 0) as delay,
      bool_and(s.step_type = 'single' and s.required_input_pattern is null
        and s.forbidden_input_pattern is null and s.opt_concurrency_key is null) over () as plain
    from pgflow.deps as d
    join pgflow.steps as s on s.flow_slug = d.flow_slug and s.step_slug = d.step_slug
    where d.flow_slug = v_flow_slug and d.dep_slug = _complete_step.step_slug
  ),
  children as (
    update pgflow.step_states as ss
    set remaining_deps = ss.remaining_deps - 1, initial_tasks = coalesce(ss.initial_tasks, v_array_length),
      status = case when ss.remaining_deps = 1 and w.plain then 'started' else ss.status end,
      started_at = case when ss.remaining_deps = 1 and w.plain then clock_timestamp() else ss.started_at end,
      remaining_tasks = case when ss.remaining_deps = 1 and w.plain then 1 else ss.remaining_tasks end
    from waiting as w
    where ss.run_id = _complete_step.run_id and ss.step_slug = w.step_slug and ss.status = 'created'
    returning ss.step_slug, ss.remaining_deps, ss.status, w.step_index, w.queue_name, w.delay
  )
  select count(*) filter (where c.remaining_deps = 0 and c.status = 'created') as ready,
    array_agg(c.step_slug order by c.step_index) filter (where c.status = 'started') as slugs,
    array_agg(c.queue_name order by c.step_index) filter (where c.status = 'started') as queues,
    array_agg(c.delay order by c.step_index) filter (where c.status = 'started') as delays
  into v_children
  from children as c;

  for i in 1 .. coalesce(cardinality(v_children.slugs), 0) loop
    perform pgflow._enqueue_step_tasks(run_id, v_flow_slug, v_children.slugs[i], v_children.queues[i], 1,
      v_children.delays[i]);
    perform pgflow._emit_event(run_id, 'step:started', v_children.slugs[i], 'started');
  end loop;

  update pgflow.runs as r
  set remaining_steps = r.remaining_steps - 1,
    status = case when r.remaining_steps = 1 and r.status = 'started' then 'completed' else r.status end,
    completed_at = case when r.remaining_steps = 1 and r.status = 'started' then clock_timestamp()
      else r.completed_at end,
    output = case when r.remaining_steps = 1 and r.status = 'started' then (
      select jsonb_object_agg(ss.step_slug, ss.output)
      from pgflow.step_states as ss
      where ss.run_id = r.run_id and ss.status = 'completed'
        and not exists (
          select 1 from pgflow.deps as d where d.flow_slug = ss.flow_slug and d.dep_slug = ss.step_slug
        )
    ) else r.output end
  where r.run_id = _complete_step.run_id
  returning r.remaining_steps = 0 and r.status = 'completed' as finished into v_run;
  if v_run.finished then
    perform pgflow._emit_event(run_id, 'run:completed', null, 'completed');
  end if;
  return v_children.ready > 0;
end;
$$;

-- pgflow.start_flow: source/0130_function_start_flow.sql
create or replace function pgflow.start_flow(
  flow_slug text, input jsonb, run_id uuid default null, idempotency_key text default null
)
returns setof pgflow.runs
language plpgsql
volatile
security definer
set search_path = ''
as $$
-- The conflict target names columns that are parameters too; every other use is qualified.
#variable_conflict use_column
declare
  v_run_id uuid := coalesce(run_id, gen_random_uuid());
  v_root_map text;
  v_input_length int;
  v_plain boolean;
  v_root record;
  v_traceparent text := substring(current_setting('pgflow.traceparent', true)
    from '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$');
begin
  perform pg_advisory_xact_lock_shared(1, hashtext(lower(flow_slug)));
  if not exists (select 1 from pgflow.flows as f where f.flow_slug = start_flow.flow_slug) then
    raise exception 'Flow "%" does not exist.', flow_slug
      using errcode = 'P0002', hint = 'Check the slug (it is case-sensitive) or compile the flow first.';
  end if;
  if idempotency_key is not null then
    return query select * from pgflow.runs as r
      where r.flow_slug = start_flow.flow_slug and r.idempotency_key = start_flow.idempotency_key;
    if found then
      return;
    end if;
  end if;
  if input is null then
    raise exception 'The input of a run of flow "%" must not be SQL NULL.', flow_slug
      using errcode = '22004', hint = 'Pass a JSON value; ''null''::jsonb is a valid JSON input.';
  end if;
  select s.step_slug into v_root_map from pgflow.steps as s
  where s.flow_slug = start_flow.flow_slug and s.step_type = 'map' and s.deps_count = 0
  order by s.step_index limit 1;
  if v_root_map is not null and jsonb_typeof(input) <> 'array' then
    raise exception 'Flow "%" maps its input in step "%", so the input must be a JSON array, got %.',
      flow_slug, v_root_map, jsonb_typeof(input)
      using errcode = '22023';
  end if;
  if jsonb_typeof(input) = 'array' then
    v_input_length := jsonb_array_length(input);
  end if;

  insert into pgflow.runs (run_id, flow_slug, input, remaining_steps, idempotency_key, traceparent)
  values (v_run_id, flow_slug, input,
    (select count(*) from pgflow.steps as s where s.flow_slug = start_flow.flow_slug),
    idempotency_key, v_traceparent)
  on conflict (flow_slug, idempotency_key) where idempotency_key is not null do nothing;
  if not found then  -- a concurrent start with this key won: its run is the one
    return query select * from pgflow.runs as r
      where r.flow_slug = start_flow.flow_slug and r.idempotency_key = start_flow.idempotency_key;
    return;
  end if;

  -- Root steps that are all plain single steps (no condition) are written started, so that no
  -- row is written twice (engine 0025), and get their messages here, as _advance_run would.
  select count(*) > 0 and bool_and(s.step_type = 'single' and s.required_input_pattern is null
      and s.forbidden_input_pattern is null) into v_plain
  from pgflow.steps as s where s.flow_slug = start_flow.flow_slug and s.deps_count = 0;
  insert into pgflow.step_states (run_id, flow_slug, step_slug, remaining_deps, initial_tasks,
    status, started_at, remaining_tasks)
  select v_run_id, s.flow_slug, s.step_slug, s.deps_count,
    case
      when s.step_type in ('single', 'signal') then 1
      when s.deps_count = 0 then v_input_length
    end,
    case when v_plain and s.deps_count = 0 then 'started' else 'created' end,
    case when v_plain and s.deps_count = 0 then clock_timestamp() end,
    case when v_plain and s.deps_count = 0 then 1 end
  from pgflow.steps as s
  where s.flow_slug = start_flow.flow_slug;

  perform pgflow._emit_event(v_run_id, 'run:started', null, 'started');
  if not v_plain then
    perform pgflow._advance_run(v_run_id);
  else
    for v_root in
      select s.step_slug, s.queue_name, coalesce(s.opt_start_delay, 0) as delay, s.opt_concurrency_key
      from pgflow.steps as s
      where s.flow_slug = start_flow.flow_slug and s.deps_count = 0
      order by s.step_index
    loop
      if v_root.opt_concurrency_key is null then
        perform pgflow._enqueue_step_tasks(v_run_id, flow_slug, v_root.step_slug, v_root.queue_name, 1,
          v_root.delay);
      else
        perform pgflow._park_keyed_tasks(flow_slug, v_root.step_slug, v_root.queue_name,
          v_root.opt_concurrency_key, v_root.delay, array[v_run_id], array[1]);
      end if;
      perform pgflow._emit_event(v_run_id, 'step:started', v_root.step_slug, 'started');
    end loop;
  end if;

  return query select * from pgflow.runs as r where r.run_id = v_run_id;
end;
$$;

-- pgflow.complete_task: source/0141_function_complete_task.sql
create or replace function pgflow.complete_task(run_id uuid, step_slug text, task_index int, output jsonb, attempt int)
returns setof pgflow.step_tasks
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_locked record;
  v_task pgflow.step_tasks;
  v_output_type text := coalesce(jsonb_typeof(output), 'SQL NULL');
begin
  perform pgflow._require_task_routes(array[run_id], array[step_slug]);
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
  -- The place a keyed task freed goes to its key's next parked task now (engine 0018).
  if current_setting('pgflow.concurrency_passes', true) = 'pending' then
    perform pgflow._pass_concurrency_places();
  end if;

  -- The task row records the completion: its message is deleted, not archived (engine 0025).
  perform pgmq.delete(v_task.queue_name, v_task.message_id);
  return next v_task;
end;
$$;

-- pgflow.complete_tasks: source/0143_function_complete_tasks.sql
create or replace function pgflow.complete_tasks(
  run_ids uuid[], step_slugs text[], task_indexes int[], outputs jsonb[], attempts int[]
)
returns setof pgflow.step_tasks
language plpgsql
volatile
security definer
set search_path = ''
set enable_seqscan = off
set plan_cache_mode = force_generic_plan
set join_collapse_limit = 1
as $$
declare
  v_count int := coalesce(cardinality(run_ids), 0);
  v_batch record;
  v_started record;
  v_missing record;
  v_queue text;
  v_general int[];
  v_attempts int[];
  v_map_positions bigint[];
  v_map_task_rows tid[];
  v_map_state_rows tid[];
  v_map_queues text[];
  v_map_messages bigint[];
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
  perform pgflow._require_task_routes(run_ids, step_slugs);
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
      s.step_type = 'map' as mapped, ss.remaining_tasks,
      s.step_type = 'single' and not exists (
        select 1 from pgflow.deps as d
        join pgflow.steps as c on c.flow_slug = d.flow_slug and c.step_slug = d.step_slug
        where d.flow_slug = s.flow_slug and d.dep_slug = s.step_slug
          and (c.step_type <> 'single' or c.required_input_pattern is not null
            or c.forbidden_input_pattern is not null or c.opt_concurrency_key is not null)
      ) as plain
    -- Joined in this order (join_collapse_limit), each by its whole key: a task by the key
    -- the caller sends, never by its step alone (a big map step has thousands).
    from unnest(run_ids, step_slugs, task_indexes, outputs, v_attempts) with ordinality
      as u (run_id, step_slug, task_index, output, attempt, ord)
    join pgflow.step_tasks as t
      on t.run_id = u.run_id and t.step_slug = u.step_slug and t.task_index = u.task_index
    join pgflow.step_states as ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug
    join pgflow.runs as r on r.run_id = t.run_id
    join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
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
    array_agg(l.ord order by l.ord) filter (where l.live and not l.plain) as general,
    -- Map tasks that do not finish their step here (fewer of its tasks in the batch than it has
    -- left) only count down their step.
    array_agg(l.ord order by l.ord) filter (where l.live and l.mapped) as map_positions,
    array_agg(l.task_row order by l.ord) filter (where l.live and l.mapped) as map_task_rows,
    array_agg(l.state_row order by l.ord) filter (where l.live and l.mapped) as map_state_rows,
    array_agg(l.remaining_tasks order by l.ord) filter (where l.live and l.mapped) as map_remaining
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
    -- The map tasks of a step with more tasks left than the batch holds complete set-based:
    -- their step only counts down, as complete_task would do for each (no event, no child).
    select array_agg(x.ord order by x.ord), array_agg(x.task_row order by x.ord),
      array_agg(x.state_row order by x.ord)
    into v_map_positions, v_map_task_rows, v_map_state_rows
    from (
      select m.ord, m.task_row, m.state_row, m.remaining,
        count(*) over (partition by m.state_row) as in_batch
      from unnest(v_batch.map_positions, v_batch.map_task_rows, v_batch.map_state_rows,
        v_batch.map_remaining) as m (ord, task_row, state_row, remaining)
    ) as x
    where x.in_batch < x.remaining;
    if v_map_positions is not null then
      v_general := array(select g from unnest(v_general) as g where not (g = any (v_map_positions)));
      if cardinality(v_general) = 0 then
        v_general := null;
      end if;
    end if;
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
    -- A run with no step left completes in the statement that counts its steps off (engine
    -- 0025): its output joins the leaves completed before (this statement's snapshot shows the
    -- batch's steps as started) with those completed by this batch.
    counted as (
      update pgflow.runs as r set remaining_steps = r.remaining_steps - n.finished,
        status = case when r.remaining_steps = n.finished then 'completed' else r.status end,
        completed_at = case when r.remaining_steps = n.finished then clock_timestamp() else r.completed_at end,
        output = case when r.remaining_steps = n.finished then (
          select jsonb_object_agg(x.step_slug, x.output)
          from (
            select ss.step_slug, ss.flow_slug, ss.output
            from pgflow.step_states as ss
            where ss.run_id = r.run_id and ss.status = 'completed'
            union all
            select f.step_slug, f.flow_slug, f.output from fast as f where f.run_id = r.run_id
          ) as x
          where not exists (
            select 1 from pgflow.deps as d where d.flow_slug = x.flow_slug and d.dep_slug = x.step_slug
          )
        ) else r.output end
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

    -- The completed tasks' messages are deleted at once, one call per queue: their task rows
    -- record them (engine 0025; archived before).
    for v_queue in select distinct q.name from unnest(v_started.done_queues) as q (name) order by 1 loop
      perform pgmq.delete(v_queue, array(
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

    -- The runs completed above say so, in run id order.
    if v_started.finished_runs is not null then
      perform pg_notify(
        'pgflow_run_' || replace(f.run_id::text, '-', ''),
        json_build_object('event', 'run:completed', 'run_id', f.run_id, 'step_slug', null, 'status', 'completed')::text
      )
      from unnest(v_started.finished_runs) as f (run_id)
      order by f.run_id;
    end if;
  end if;

  if v_map_positions is not null then
    with counted as (
      update pgflow.step_states as ss set remaining_tasks = ss.remaining_tasks - c.n
      from (
        select m.state_row, count(*)::int as n from unnest(v_map_state_rows) as m (state_row)
        group by m.state_row
      ) as c
      where ss.ctid = any (v_map_state_rows) and ss.ctid = c.state_row
    ),
    done as (
      update pgflow.step_tasks as t
      set status = 'completed', output = outputs[m.ord], completed_at = clock_timestamp()
      from unnest(v_map_positions, v_map_task_rows) as m (ord, task_row)
      where t.ctid = any (v_map_task_rows) and t.ctid = m.task_row
      returning t.queue_name, t.message_id
    )
    select array_agg(d.queue_name order by d.message_id), array_agg(d.message_id order by d.message_id)
    into v_map_queues, v_map_messages
    from done as d;
    for v_queue in select distinct q.name from unnest(v_map_queues) as q (name) order by 1 loop
      perform pgmq.delete(v_queue, array(
        select m.message_id from unnest(v_map_queues, v_map_messages) as m (queue_name, message_id)
        where m.queue_name = v_queue));
    end loop;
  end if;

  if v_general is not null then
    foreach i in array v_general loop
      perform pgflow.complete_task(run_ids[i], step_slugs[i], task_indexes[i], outputs[i], v_attempts[i]);
    end loop;
  end if;
  -- The places keyed tasks freed go to their keys' next parked tasks now (engine 0018).
  if current_setting('pgflow.concurrency_passes', true) = 'pending' then
    perform pgflow._pass_concurrency_places();
  end if;

  return query
  select t.*
  from unnest(run_ids, step_slugs, task_indexes) with ordinality as u (run_id, step_slug, task_index, ord)
  join pgflow.step_tasks as t
    on t.run_id = u.run_id and t.step_slug = u.step_slug and t.task_index = u.task_index
  order by u.ord;
end;
$$;

-- pgflow.finished_tasks: source/0167_function_finished_tasks.sql
create or replace function pgflow.finished_tasks(since interval default '1 hour', by_step boolean default true)
returns table (queue_name text, step_slug text, minute timestamptz, tasks bigint)
language plpgsql
stable
security definer
set search_path = ''
-- Its few rows are not worth parallel workers (starting them cost 6 ms of a 1 ms query).
set max_parallel_workers_per_gather = 0
as $$
declare
  v_queue record;
  v_parts text[] := array[
    'select t.queue_name, case when $2 then t.step_slug end as step_slug,'
    ' date_trunc(''minute'', t.completed_at) as minute, count(*) as tasks'
    ' from pgflow.step_tasks as t where t.completed_at > now() - $1 and t.status = ''completed'''
    ' group by 1, 2, 3'];
begin
  for v_queue in
    select q.queue_name, min(q.step_slug) as only_step, count(distinct q.step_slug) = 1 as one_step
    from (
      select s.queue_name, s.step_slug from pgflow.steps as s where s.step_type <> 'signal'
      union
      select pgflow.default_queue_name(f.flow_slug), null from pgflow.flows as f
      where f.queue_mode = 'flow'
    ) as q
    group by q.queue_name
    order by q.queue_name
  loop
    continue when to_regclass(format('pgmq.%I', pgflow.pgmq_table_name(v_queue.queue_name, 'a'))) is null;
    v_parts := v_parts || format(
      'select %1$L::text, case when $2 then %2$s end, date_trunc(''minute'', a.archived_at), count(*)'
      ' from pgmq.%3$I as a where a.archived_at > now() - $1'
      ' and not exists (select 1 from pgflow.step_tasks as t'
      '   where t.message_id = a.msg_id and t.queue_name = %1$L and t.status = ''completed'')'
      ' group by 1, 2, 3',
      v_queue.queue_name,
      case when v_queue.one_step then quote_nullable(v_queue.only_step) || '::text'
        else 'a.message ->> ''step_slug''' end,
      pgflow.pgmq_table_name(v_queue.queue_name, 'a'));
  end loop;
  return query execute
    'select f.queue_name, f.step_slug, f.minute, sum(f.tasks)::bigint from ('
    || array_to_string(v_parts, ' union all ')
    || ') as f group by 1, 2, 3'
    using since, by_step;
end;
$$;
-- No engine function runs for PUBLIC (engine 0019), those above included.
revoke execute on all functions in schema pgflow from public;

-- Engine migration 0031: priority.
--
-- A run can have a priority (issue 38): start_flow and start_flows take priority int default 0
-- (0 to 1000); subflow runs take their parent's, forked runs their source's. A task's message
-- carries its run's priority when it has one ({"priority": n}, pgflow._priority_key; the
-- messages of runs without one are unchanged), and every pgflow queue gets a partial index of
-- such messages (pgflow._create_priority_index: here for the queues before 0031, by
-- create_flow and create_flow_from_shape for new ones). read_and_claim, while some started run
-- of the flow has a priority (the new index runs_prioritised_idx answers that for one probe),
-- first reads the visible prioritised messages, the highest first and the oldest among equals
-- (pgflow._read_prioritised), then first in, first out as before. A schedule can give its
-- runs a priority (its shape's "priority"). New columns: runs.priority, schedules.priority.
-- start_flow, start_flows and _start_runs gain the parameter (so they are dropped and created
-- again).

-- BEGIN HAND-WRITTEN: tables and data, applied before the functions below.
alter table pgflow.runs
  add column priority int not null default 0,
  add constraint priority_is_in_range check (priority between 0 and 1000);
create index runs_prioritised_idx on pgflow.runs (flow_slug, priority desc)
  where priority > 0 and status = 'started';
-- The queues of the flows before 0031 get their index of prioritised messages, as
-- pgflow._create_priority_index (defined below) gives new ones.
do $$
declare
  v_queue text;
begin
  for v_queue in
    select m.queue_name from pgmq.meta as m
    where m.queue_name in (
      select pgflow.default_queue_name(f.flow_slug) from pgflow.flows as f where f.queue_mode = 'flow'
      union
      select s.queue_name from pgflow.steps as s
    )
    order by 1
  loop
    execute format(
      'create index if not exists %I on pgmq.%I (((message ->> ''priority'')::int) desc, msg_id)'
      ' where message ? ''priority''',
      'pgflow_priority_' || md5(v_queue), pgflow.pgmq_table_name(v_queue));
  end loop;
end;
$$;
alter table pgflow.schedules
  add column priority int not null default 0,
  add constraint schedules_priority_is_in_range check (priority between 0 and 1000);
-- END HAND-WRITTEN

-- Written by `make migration` from pgflow_gen/runtime/sql/source/: edit the source, then
-- write the migration again; only the header and the hand-written section above are kept.

-- pgflow._start_runs: gone from the source
drop function pgflow._start_runs(text,jsonb[],text[],uuid,text,integer[]);

-- pgflow.start_flow: gone from the source
drop function pgflow.start_flow(text,jsonb,uuid,text);

-- pgflow.start_flows: gone from the source
drop function pgflow.start_flows(text,jsonb[],text[]);

-- pgflow._enqueue_step_tasks: source/0105_function_enqueue_step_tasks.sql
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
  v_priority jsonb;
begin
  select pgflow._priority_key(r.priority) into v_priority
  from pgflow.runs as r where r.run_id = _enqueue_step_tasks.run_id;
  if task_count = 1 then
    execute format('insert into pgmq.%I (vt, message) values ($1, $2) returning msg_id', v_queue_table)
    into v_message_id
    using clock_timestamp() + make_interval(secs => delay_seconds),
      jsonb_build_object('flow_slug', flow_slug, 'run_id', run_id, 'step_slug', step_slug, 'task_index', 0)
        || v_priority;
    insert into pgflow.step_tasks (run_id, flow_slug, step_slug, task_index, message_id, queue_name)
    values (run_id, flow_slug, step_slug, 0, v_message_id, queue_name);
    return;
  end if;

  execute format(
    $q$
      with sent as (
        insert into pgmq.%I (vt, message)
        select $1, jsonb_build_object('flow_slug', $2, 'run_id', $3, 'step_slug', $4, 'task_index', i)
          || $6
        from generate_series(0, $5 - 1) as i
        returning msg_id, (message ->> 'task_index')::int as task_index
      )
      select array_agg(msg_id), array_agg(task_index) from sent
    $q$,
    v_queue_table
  )
  into v_message_ids, v_task_indexes
  using clock_timestamp() + make_interval(secs => delay_seconds), flow_slug, run_id, step_slug, task_count,
    v_priority;
  insert into pgflow.step_tasks (run_id, flow_slug, step_slug, task_index, message_id, queue_name)
  select _enqueue_step_tasks.run_id, _enqueue_step_tasks.flow_slug, _enqueue_step_tasks.step_slug,
    m.task_index, m.message_id, _enqueue_step_tasks.queue_name
  from unnest(v_task_indexes, v_message_ids) as m (task_index, message_id);
end;
$$;

-- pgflow.create_flow: source/0110_function_create_flow.sql
create or replace function pgflow.create_flow(
  flow_slug text,
  max_attempts int default null,
  base_delay int default null,
  timeout int default null
)
returns pgflow.flows
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_flow pgflow.flows;
  v_queue text := pgflow.default_queue_name(flow_slug);
begin
  -- GUARD: the slug rules and the default queue's length, with the resolver's errors.
  perform from pgflow.derive_queue_routes(flow_slug, '{}', 'flow');

  perform pgflow._lock_flow_definition(flow_slug);

  select * into v_flow from pgflow.flows as f where lower(f.flow_slug) = lower(create_flow.flow_slug);
  if found and v_flow.flow_slug <> create_flow.flow_slug then
    raise exception 'Flow "%" differs only in case from the existing flow "%".', flow_slug, v_flow.flow_slug
      using errcode = '23505',
        detail = 'Flow slugs are unique ignoring case.',
        hint = 'Use the existing spelling, or a different flow slug.';
  end if;
  if found and v_flow.queue_mode <> 'flow' then
    raise exception 'Flow "%" uses per-step queues; create_flow defines flow-mode flows only.', flow_slug
      using errcode = '55000',
        hint = 'A step-queued flow is defined as a whole by pgflow.ensure_flow_compiled().';
  end if;
  if found then
    if (max_attempts is not null and max_attempts <> v_flow.opt_max_attempts)
      or (base_delay is not null and base_delay <> v_flow.opt_base_delay)
      or (timeout is not null and timeout <> v_flow.opt_timeout) then
      raise exception 'Flow "%" already exists with different options.', flow_slug
        using errcode = '23505',
          detail = format('existing max_attempts=%s, base_delay=%s, timeout=%s',
            v_flow.opt_max_attempts, v_flow.opt_base_delay, v_flow.opt_timeout),
          hint = 'Change options of an existing flow with UPDATE pgflow.flows, or use a new flow slug.';
    end if;
    return v_flow;
  end if;

  perform pgflow._preflight_queue_names(flow_slug, array[v_queue]);
  v_flow := pgflow._insert_flow(flow_slug, 'flow', max_attempts, base_delay, timeout);
  perform pgmq.create(v_queue);
  perform pgflow._create_priority_index(v_queue);
  return v_flow;
end;
$$;

-- pgflow._create_flow_from_shape: source/0114_function_create_flow_from_shape.sql
create or replace function pgflow._create_flow_from_shape(flow_slug text, shape jsonb, queue_mode text, queue_names text[])
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_options jsonb := coalesce(shape -> 'options', '{}');
  v_step jsonb;
  v_index bigint;
  v_step_options jsonb;
  v_queue text;
begin
  if queue_mode = 'flow' then
    perform pgflow.create_flow(
      flow_slug, (v_options ->> 'maxAttempts')::int, (v_options ->> 'baseDelay')::int,
      (v_options ->> 'timeout')::int
    );
  else
    perform pgflow._preflight_queue_names(flow_slug, queue_names);
    perform pgflow._insert_flow(
      flow_slug, 'step', (v_options ->> 'maxAttempts')::int, (v_options ->> 'baseDelay')::int,
      (v_options ->> 'timeout')::int
    );
  end if;

  for v_step, v_index in select s.value, s.ordinality from jsonb_array_elements(shape -> 'steps') with ordinality as s loop
    v_step_options := coalesce(v_step -> 'options', '{}');
    perform pgflow._insert_step(
      flow_slug,
      v_step ->> 'slug',
      array(select jsonb_array_elements_text(coalesce(v_step -> 'dependencies', '[]'))),
      (v_step_options ->> 'maxAttempts')::int,
      (v_step_options ->> 'baseDelay')::int,
      (v_step_options ->> 'timeout')::int,
      (v_step_options ->> 'startDelay')::int,
      coalesce(v_step ->> 'stepType', 'single'),
      case when (v_step #>> '{requiredInputPattern,defined}')::boolean
        then v_step #> '{requiredInputPattern,value}' end,
      case when (v_step #>> '{forbiddenInputPattern,defined}')::boolean
        then v_step #> '{forbiddenInputPattern,value}' end,
      coalesce(v_step ->> 'whenUnmet', 'skip'),
      coalesce(v_step ->> 'whenExhausted', 'fail'),
      queue_names[v_index],
      v_step ->> 'subflowSlug'
    );
  end loop;

  if queue_mode = 'step' then
    -- A signal or subflow step runs no task in a worker: its route is reserved, but it has no queue.
    for v_queue in
      select s.queue_name from pgflow.steps as s
      where s.flow_slug = _create_flow_from_shape.flow_slug and s.step_type <> 'signal'
        and s.subflow_slug is null
      order by s.step_index
    loop
      perform pgmq.create(v_queue);
      perform pgflow._create_priority_index(v_queue);
    end loop;
  end if;
end;
$$;

-- pgflow.start_flow: source/0130_function_start_flow.sql
create function pgflow.start_flow(
  flow_slug text, input jsonb, run_id uuid default null, idempotency_key text default null,
  priority int default 0
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
  v_flow record;
  v_run pgflow.runs;
  v_input_length int;
  v_root record;
  v_traceparent text := substring(current_setting('pgflow.traceparent', true)
    from '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$');
begin
  perform pg_advisory_xact_lock_shared(1, hashtext(lower(flow_slug)));
  -- The definition is read once (engine 0026): no row when the flow does not exist, else its
  -- step count, its first root map step, and whether every root step is a plain single step
  -- (no condition), whose step state is then written started.
  select count(s.step_slug)::int as step_count,
    (array_agg(s.step_slug order by s.step_index)
      filter (where s.step_type = 'map' and s.deps_count = 0))[1] as root_map,
    coalesce(bool_and(s.step_type = 'single' and s.required_input_pattern is null
      and s.forbidden_input_pattern is null) filter (where s.deps_count = 0), false) as plain
  into v_flow
  from pgflow.flows as f
  left join pgflow.steps as s on s.flow_slug = f.flow_slug
  where f.flow_slug = start_flow.flow_slug
  group by f.flow_slug;
  if not found then
    raise exception 'Flow "%" does not exist.', flow_slug
      using errcode = 'P0002', hint = 'Check the slug (it is case-sensitive) or compile the flow first.';
  end if;
  if priority is null or priority not between 0 and 1000 then
    raise exception 'The priority of a run must be between 0 and 1000, got %.', coalesce(priority::text, 'NULL')
      using errcode = '22023', hint = '0 is the default and the lowest; the tasks of runs with a higher one are claimed first.';
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
  if v_flow.root_map is not null and jsonb_typeof(input) <> 'array' then
    raise exception 'Flow "%" maps its input in step "%", so the input must be a JSON array, got %.',
      flow_slug, v_flow.root_map, jsonb_typeof(input)
      using errcode = '22023';
  end if;
  if jsonb_typeof(input) = 'array' then
    v_input_length := jsonb_array_length(input);
  end if;

  insert into pgflow.runs (run_id, flow_slug, input, remaining_steps, idempotency_key, traceparent, priority)
  values (v_run_id, flow_slug, input, v_flow.step_count, idempotency_key, v_traceparent, priority)
  on conflict (flow_slug, idempotency_key) where idempotency_key is not null do nothing
  returning * into v_run;
  if not found then  -- a concurrent start with this key won: its run is the one
    return query select * from pgflow.runs as r
      where r.flow_slug = start_flow.flow_slug and r.idempotency_key = start_flow.idempotency_key;
    return;
  end if;

  -- Root steps that are all plain single steps (no condition) are written started, so that no
  -- row is written twice (engine 0025), and get their messages here, as _advance_run would.
  insert into pgflow.step_states (run_id, flow_slug, step_slug, remaining_deps, initial_tasks,
    status, started_at, remaining_tasks)
  select v_run_id, s.flow_slug, s.step_slug, s.deps_count,
    case
      when s.step_type in ('single', 'signal', 'subflow') then 1
      when s.deps_count = 0 then v_input_length
    end,
    case when v_flow.plain and s.deps_count = 0 then 'started' else 'created' end,
    case when v_flow.plain and s.deps_count = 0 then clock_timestamp() end,
    case when v_flow.plain and s.deps_count = 0 then 1 end
  from pgflow.steps as s
  where s.flow_slug = start_flow.flow_slug;

  perform pgflow._emit_event(v_run_id, 'run:started', null, 'started');
  if not v_flow.plain then
    perform pgflow._advance_run(v_run_id);  -- may finish the run (a skip): read it again
    return query select * from pgflow.runs as r where r.run_id = v_run_id;
    return;
  end if;
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
  -- Starting plain root steps never changes the run's row: it is returned as inserted (engine
  -- 0026), not read again.
  return next v_run;
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
  v_keyed record;
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
      s.step_type = 'map' as mapped, ss.remaining_tasks, s.subflow_slug is not null as subflow,
      s.step_type = 'single' and not exists (
        select 1 from pgflow.deps as d
        join pgflow.steps as c on c.flow_slug = d.flow_slug and c.step_slug = d.step_slug
        where d.flow_slug = s.flow_slug and d.dep_slug = s.step_slug
          and (c.step_type <> 'single' or c.required_input_pattern is not null
            or c.forbidden_input_pattern is not null)
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
    (array_agg(l.ord order by l.ord) filter (where l.subflow))[1] as subflow_position,
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

  -- GUARD: a subflow step's task (engine 0028) ends with its child run, never by a report.
  if v_batch.subflow_position is not null then
    raise exception 'Task % of step "%" in run % runs a subflow: it ends when its child run does.',
      task_indexes[v_batch.subflow_position], step_slugs[v_batch.subflow_position], run_ids[v_batch.subflow_position]
      using errcode = '55000', hint = 'Nothing was changed. Complete, fail or cancel the child run instead.';
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
      returning r.run_id, r.remaining_steps, r.parent_run_id
    )
    select array_agg(c.run_id order by c.run_id, s.step_index) as run_ids,
      array_agg(c.flow_slug order by c.run_id, s.step_index) as flow_slugs,
      array_agg(c.step_slug order by c.run_id, s.step_index) as step_slugs,
      array_agg(s.queue_name order by c.run_id, s.step_index) as queue_names,
      array_agg(coalesce(s.opt_start_delay, 0) order by c.run_id, s.step_index) as delays,
      array_agg(c.last order by c.run_id, s.step_index) as positions,
      array_agg(s.step_index order by c.run_id, s.step_index) as step_indexes,
      array_agg(s.opt_concurrency_key order by c.run_id, s.step_index) as key_paths,
      (select array_agg(n.run_id) from counted as n where n.remaining_steps = 0) as finished_runs,
      (select array_agg(n.run_id order by n.run_id) from counted as n
       where n.remaining_steps = 0 and n.parent_run_id is not null) as finished_children,
      (select array_agg(d.queue_name order by d.message_id) from done as d) as done_queues,
      (select array_agg(d.message_id order by d.message_id) from done as d) as done_messages
    into v_started
    from children as c
    join pgflow.steps as s on s.flow_slug = c.flow_slug and s.step_slug = c.step_slug
    where c.remaining_deps = 0;

    -- One message per started child without a key (a single step has one task), one insert per
    -- queue; the task rows are paired with their messages by the task key the message carries.
    for v_queue in
      select distinct q.name from unnest(v_started.queue_names, v_started.key_paths) as q (name, key_path)
      where q.key_path is null order by 1
    loop
      execute format(
        $q$
          with sent as (
            insert into pgmq.%I (vt, message)
            select clock_timestamp() + make_interval(secs => x.delay),
              jsonb_build_object('flow_slug', x.flow_slug, 'run_id', x.run_id, 'step_slug', x.step_slug, 'task_index', 0)
                || pgflow._priority_key((select r.priority from pgflow.runs as r where r.run_id = x.run_id))
            from unnest($1::uuid[], $2::text[], $3::text[], $4::int[], $5::text[], $7::text[])
              as x (run_id, flow_slug, step_slug, delay, queue_name, key_path)
            where x.queue_name = $6 and x.key_path is null
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
        v_started.queue_names, v_queue, v_started.key_paths;
    end loop;

    -- A started child with a concurrency key has its task parked under its key's value (engine
    -- 0018), as pgflow._advance_run parks it: one call per child step, its runs in the order of
    -- the completions that started them (engine 0027; before, each went through complete_task).
    for v_keyed in
      select k.flow_slug, k.step_slug, k.queue_name, k.key_path, k.delay,
        array_agg(k.run_id order by k.position, k.run_id) as run_ids
      from unnest(v_started.flow_slugs, v_started.step_slugs, v_started.queue_names,
        v_started.key_paths, v_started.delays, v_started.run_ids, v_started.positions)
        as k (flow_slug, step_slug, queue_name, key_path, delay, run_id, position)
      where k.key_path is not null
      group by k.flow_slug, k.step_slug, k.queue_name, k.key_path, k.delay
      order by k.flow_slug, k.step_slug
    loop
      perform pgflow._park_keyed_tasks(v_keyed.flow_slug, v_keyed.step_slug, v_keyed.queue_name,
        v_keyed.key_path, v_keyed.delay, v_keyed.run_ids, array_fill(1, array[cardinality(v_keyed.run_ids)]));
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
    -- Subflow runs completed above complete their parents' tasks (engine 0028).
    if v_started.finished_children is not null then
      perform pgflow._settle_parent_task(f.run_id) from unnest(v_started.finished_children) as f (run_id);
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

-- pgflow.read_and_claim: source/0152_function_read_and_claim.sql
create or replace function pgflow.read_and_claim(
  flow_slug text,
  queue_name text,
  worker_id uuid,
  qty int,
  vt int,
  step_slug text default null
)
returns setof pgflow.claimed_task
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_route record;
  v_read bigint[];
  v_claimed pgflow.claimed_task[];
  v_unclaimed bigint[];
  v_next float8;
  v_qty int := qty;
  v_allowed int;
  v_retry float8;
begin
  -- GUARD: a wrong selector raises before any message is read (no messages: nothing claimed).
  v_route := pgflow._claim_route(flow_slug, queue_name, step_slug);
  if step_slug is not null and exists (
    select 1 from pgflow.step_limits as l
    where l.flow_slug = read_and_claim.flow_slug and l.step_slug = read_and_claim.step_slug
  ) then
    select c.allowed, c.retry_in_s into v_allowed, v_retry
    from pgflow._step_capacity(flow_slug, step_slug) as c;
    if v_allowed >= qty then
      v_retry := null;  -- room for all it asks for
    else
      v_qty := v_allowed;
      raise notice 'read_and_claim limited step "%" of flow "%" to % of % task(s).',
        step_slug, flow_slug, v_qty, qty
        using detail = jsonb_build_object('limited_step', step_slug, 'wanted', qty, 'allowed', v_qty)::text;
    end if;
  end if;
  v_read := '{}';
  -- Tasks of runs with a priority come first (engine 0031): the highest first, then the oldest.
  if v_qty > 0 and exists (
    select 1 from pgflow.runs as r
    where r.flow_slug = read_and_claim.flow_slug and r.priority > 0 and r.status = 'started'
  ) then
    v_read := pgflow._read_prioritised(v_route.queue, coalesce(v_route.lease, vt), v_qty);
  end if;
  if v_qty > cardinality(v_read) then
    select v_read || coalesce(array_agg(m.msg_id), '{}') into v_read
    from pgmq.read(v_route.queue, coalesce(v_route.lease, vt), v_qty - cardinality(v_read)) as m;
  end if;
  -- A worker that read less than it asked for sleeps until a message comes: an insert wakes it,
  -- but nothing tells it when a hidden one (a retry's delay, a start delay, a lease) shows again.
  -- So say when the first of them does, and it sleeps until then rather than a whole poll.
  if cardinality(v_read) < qty then
    execute format(
      'select extract(epoch from min(q.vt) - clock_timestamp())::float8 from pgmq.%I as q'
      ' where q.vt > clock_timestamp() and not (q.msg_id = any ($1))',
      pgflow.pgmq_table_name(v_route.queue))
    into v_next using v_read;
    if v_retry is not null then
      v_next := least(v_next, v_retry);  -- no room now: ask again then
    end if;
    if v_next is not null then
      raise notice 'read_and_claim: the next message of queue "%" is visible in % s.',
        v_route.queue, round(v_next::numeric, 3)
        using detail = jsonb_build_object('next_visible_in_s', v_next)::text;
    end if;
  end if;
  if cardinality(v_read) = 0 then
    return;
  end if;
  select coalesce(array_agg(c order by c.msg_id), '{}') into v_claimed
  from pgflow._claim_messages(flow_slug, v_route.queue, worker_id, step_slug, v_read,
    v_route.step_slugs, v_route.timeouts, v_route.lease, vt) as c;
  if cardinality(v_claimed) < cardinality(v_read) then
    v_unclaimed := array(
      select r.id from unnest(v_read) as r (id)
      except
      select c.msg_id from unnest(v_claimed) as c
      order by 1
    );
    raise notice 'read_and_claim left % message(s) of queue "%" unclaimed.',
      cardinality(v_unclaimed), v_route.queue
      using detail = jsonb_build_object('unclaimed_message_ids', to_jsonb(v_unclaimed))::text;
  end if;
  return query select * from unnest(v_claimed);
end;
$$;

-- pgflow.start_flows: source/0156_function_start_flows.sql
create function pgflow.start_flows(
  flow_slug text, inputs jsonb[], idempotency_keys text[] default null, priority int default 0
)
returns setof pgflow.runs
language plpgsql
volatile
security definer
set search_path = ''
as $$
begin
  return query select * from pgflow._start_runs(flow_slug, inputs, idempotency_keys, priority => priority);
end;
$$;

-- pgflow._store_schedules: source/0172_function_store_schedules.sql
create or replace function pgflow._store_schedules(flow_slug text, shape jsonb)
returns jsonb
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_wanted jsonb := coalesce(shape -> 'schedules', '[]');
  v_entry jsonb;
  v_changes jsonb := '[]';
  v_row record;
begin
  if shape -> 'options' is null then
    return v_changes;
  end if;
  if jsonb_typeof(v_wanted) <> 'array' then
    raise exception 'Invalid flow shape: "schedules" must be an array, got %.', jsonb_typeof(v_wanted)
      using errcode = '22023';
  end if;
  for v_entry in select e.value from jsonb_array_elements(v_wanted) as e loop
    if jsonb_typeof(v_entry -> 'name') is distinct from 'string' or jsonb_typeof(v_entry -> 'cron') is distinct from 'string' then
      raise exception 'Invalid flow shape: a schedule needs a "name" and a "cron" string, got %.', v_entry
        using errcode = '22023';
    end if;
    if not exists (select 1 from pg_catalog.pg_timezone_names as z where z.name = coalesce(v_entry ->> 'timezone', 'UTC')) then
      raise exception 'Invalid flow shape: schedule "%" has an unknown time zone "%".', v_entry ->> 'name', v_entry ->> 'timezone'
        using errcode = '22023', hint = 'Use an IANA name such as UTC or Europe/Paris.';
    end if;
    if coalesce(v_entry ->> 'catchUp', 'none') not in ('none', 'latest', 'all') then
      raise exception 'Invalid flow shape: schedule "%" has catchUp "%"; it takes none, latest or all.',
        v_entry ->> 'name', v_entry ->> 'catchUp'
        using errcode = '22023';
    end if;
    if v_entry ? 'priority' and not (jsonb_typeof(v_entry -> 'priority') = 'number'
        and (v_entry ->> 'priority') ~ '^(1000|[0-9]{1,3})$') then
      raise exception 'Invalid flow shape: schedule "%" has priority %; it takes a whole number from 0 to 1000.',
        v_entry ->> 'name', v_entry -> 'priority'
        using errcode = '22023';
    end if;
  end loop;
  if (select count(distinct e.value ->> 'name') <> count(*) from jsonb_array_elements(v_wanted) as e) then
    raise exception 'Invalid flow shape: two schedules have the same name.' using errcode = '22023';
  end if;

  for v_row in
    select e.value as entry, s.schedule_name is null as is_new,
      s.cron is distinct from e.value ->> 'cron'
        or s.timezone is distinct from coalesce(e.value ->> 'timezone', 'UTC')
        or s.input is distinct from coalesce(e.value -> 'input', '{}')
        or s.catch_up is distinct from coalesce(e.value ->> 'catchUp', 'none')
        or s.priority is distinct from coalesce((e.value ->> 'priority')::int, 0) as is_changed
    from jsonb_array_elements(v_wanted) with ordinality as e (value, ord)
    left join pgflow.schedules as s
      on s.flow_slug = _store_schedules.flow_slug and s.schedule_name = e.value ->> 'name'
    order by e.ord
  loop
    continue when not (v_row.is_new or v_row.is_changed);
    insert into pgflow.schedules as s (flow_slug, schedule_name, cron, timezone, input, catch_up, priority)
    values (_store_schedules.flow_slug, v_row.entry ->> 'name', v_row.entry ->> 'cron',
      coalesce(v_row.entry ->> 'timezone', 'UTC'), coalesce(v_row.entry -> 'input', '{}'),
      coalesce(v_row.entry ->> 'catchUp', 'none'), coalesce((v_row.entry ->> 'priority')::int, 0))
    on conflict on constraint schedules_pkey do update
    set cron = excluded.cron, timezone = excluded.timezone, input = excluded.input,
      catch_up = excluded.catch_up, priority = excluded.priority, updated_at = now();
    v_changes := v_changes || jsonb_build_object('schedule', v_row.entry ->> 'name',
      'change', case when v_row.is_new then 'added' else 'changed' end);
  end loop;

  with gone as (
    delete from pgflow.schedules as s
    where s.flow_slug = _store_schedules.flow_slug
      and not exists (select 1 from jsonb_array_elements(v_wanted) as e where e.value ->> 'name' = s.schedule_name)
    returning s.schedule_name
  )
  select v_changes || coalesce(jsonb_agg(jsonb_build_object('schedule', g.schedule_name, 'change', 'removed')
      order by g.schedule_name), '[]')
  into v_changes from gone as g;
  return v_changes;
end;
$$;

-- pgflow.start_scheduled_runs: source/0173_function_start_scheduled_runs.sql
create or replace function pgflow.start_scheduled_runs(
  flow_slug text,
  schedule_name text,
  slots timestamptz[],
  passed_through timestamptz default null
)
returns table (slot timestamptz, run_id uuid, created boolean)
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_schedule pgflow.schedules;
  v_slot timestamptz;
  v_run pgflow.runs;
  v_now timestamptz := clock_timestamp();
  v_slots timestamptz[];
  v_unit text;
begin
  perform pgflow._require_flow_route(flow_slug);
  select * into v_schedule from pgflow.schedules as s
  where s.flow_slug = start_scheduled_runs.flow_slug and s.schedule_name = start_scheduled_runs.schedule_name
  for update;
  if not found then
    raise exception 'Flow "%" has no schedule "%".', flow_slug, schedule_name
      using errcode = 'P0002', hint = '`pgflow-gen schedules` lists them.';
  end if;
  if v_schedule.paused_at is not null then
    return;
  end if;
  -- The slots that may start: past ones the cron expression names (or, for syntax the engine
  -- does not read, any cron expression could name), after the last slot, the latest 100
  -- (MAX_CATCH_UP).
  v_unit := case when cardinality(regexp_split_to_array(btrim(v_schedule.cron), '\s+')) = 6
    then 'second' else 'minute' end;
  v_slots := array(
    select x.s from (
      select distinct s from unnest(slots) as s
      where s > coalesce(v_schedule.last_slot_at, '-infinity'::timestamptz) and s <= v_now
        and s = date_trunc(v_unit, s)
        and coalesce(pgflow._cron_names(v_schedule.cron, v_schedule.timezone, s), true)
      order by s desc
      limit 100
    ) as x
    order by x.s
  );
  foreach v_slot in array v_slots loop
    select * into v_run from pgflow.start_flow(
      start_scheduled_runs.flow_slug, v_schedule.input, null,
      format('schedule:%s:%s', start_scheduled_runs.schedule_name,
        to_char(v_slot at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')),
      v_schedule.priority);
    slot := v_slot;
    run_id := v_run.run_id;
    created := v_run.started_at = now();
    v_schedule.last_run_id := v_run.run_id;
    return next;
  end loop;
  update pgflow.schedules as s
  set last_slot_at = greatest(s.last_slot_at,
      (select max(x) from unnest(v_slots) as x),
      case when passed_through is not null then least(passed_through, v_now) end),
    last_run_id = v_schedule.last_run_id
  where s.flow_slug = start_scheduled_runs.flow_slug and s.schedule_name = start_scheduled_runs.schedule_name;
end;
$$;

-- pgflow._unpark_tasks: source/0181_function_unpark_tasks.sql
create or replace function pgflow._unpark_tasks(flow_slug text, step_slug text, concurrency_key text, qty int)
returns int
language plpgsql
volatile
set search_path = ''
set enable_seqscan = off
as $$
declare
  v_seqs bigint[];
  v_runs uuid[];
  v_indexes int[];
  v_queues text[];
  v_not_befores timestamptz[];
  v_priorities int[];
  v_queue text;
  v_table text;
  v_message_id bigint;
  v_sent int := 0;
begin
  select array_agg(k.parked_seq order by k.parked_seq), array_agg(k.run_id order by k.parked_seq),
    array_agg(k.task_index order by k.parked_seq), array_agg(k.queue_name order by k.parked_seq),
    array_agg(k.not_before order by k.parked_seq), array_agg(k.priority order by k.parked_seq)
  into v_seqs, v_runs, v_indexes, v_queues, v_not_befores, v_priorities
  from (
    select p.parked_seq, t.run_id, t.task_index, t.queue_name, p.not_before, r.priority
    from pgflow.parked_tasks as p
    join pgflow.step_tasks as t
      on t.run_id = p.run_id and t.step_slug = p.step_slug and t.task_index = p.task_index
    join pgflow.runs as r on r.run_id = t.run_id
    where p.flow_slug = _unpark_tasks.flow_slug and p.step_slug = _unpark_tasks.step_slug
      and p.concurrency_key = _unpark_tasks.concurrency_key
      and t.status = 'queued' and t.message_id is null
    order by p.parked_seq
    limit qty
    for update of p, t skip locked
  ) as k;
  if v_seqs is null then
    return 0;
  end if;
  delete from pgflow.parked_tasks as p
  where p.flow_slug = _unpark_tasks.flow_slug and p.step_slug = _unpark_tasks.step_slug
    and p.concurrency_key = _unpark_tasks.concurrency_key and p.parked_seq = any (v_seqs);
  -- One message at a time: a plain insert costs less to plan than one statement for all, and
  -- most calls give one task its message.
  for i in 1 .. cardinality(v_seqs) loop
    if v_queue is distinct from v_queues[i] then
      v_queue := v_queues[i];
      v_table := pgflow.pgmq_table_name(v_queue);
    end if;
    execute format('insert into pgmq.%I (vt, message) values ($1, $2) returning msg_id', v_table)
    into v_message_id
    using greatest(clock_timestamp(), v_not_befores[i]),
      jsonb_build_object('flow_slug', flow_slug, 'run_id', v_runs[i], 'step_slug', step_slug,
        'task_index', v_indexes[i]) || pgflow._priority_key(v_priorities[i]);
    update pgflow.step_tasks as t set message_id = v_message_id
    where t.run_id = v_runs[i] and t.step_slug = _unpark_tasks.step_slug and t.task_index = v_indexes[i];
    v_sent := v_sent + 1;
  end loop;
  return v_sent;
end;
$$;

-- pgflow._retry_run: source/0210_function_retry_run_internal.sql
create or replace function pgflow._retry_run(run_id uuid, delay_seconds int)
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

-- pgflow._start_runs: source/0213_function_start_runs.sql
create function pgflow._start_runs(
  flow_slug text, inputs jsonb[], idempotency_keys text[] default null,
  parent_run_id uuid default null, parent_step_slug text default null, parent_task_indexes int[] default null,
  priority int default 0
)
returns setof pgflow.runs
language plpgsql
volatile
set search_path = ''
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
as $$
-- The conflict target names columns that are parameters too; every other use is qualified.
#variable_conflict use_column
declare
  v_count int := coalesce(cardinality(inputs), 0);
  v_flow record;
  v_bad record;
  v_ids uuid[];
  v_new uuid[];
  v_new_inputs jsonb[];
  v_root record;
  v_traceparent text := substring(current_setting('pgflow.traceparent', true)
    from '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$');
  v_indexes int[] := coalesce(parent_task_indexes, array_fill(null::int, array[v_count]));
  v_priority int := priority;
begin
  perform pg_advisory_xact_lock_shared(1, hashtext(lower(flow_slug)));
  -- The definition is read once (engine 0026), as start_flow reads it.
  select count(s.step_slug)::int as step_count,
    (array_agg(s.step_slug order by s.step_index)
      filter (where s.step_type = 'map' and s.deps_count = 0))[1] as root_map,
    coalesce(bool_and(s.step_type = 'single' and s.required_input_pattern is null
      and s.forbidden_input_pattern is null) filter (where s.deps_count = 0), false) as plain
  into v_flow
  from pgflow.flows as f
  left join pgflow.steps as s on s.flow_slug = f.flow_slug
  where f.flow_slug = _start_runs.flow_slug
  group by f.flow_slug;
  if not found then
    raise exception 'Flow "%" does not exist.', flow_slug
      using errcode = 'P0002', hint = 'Check the slug (it is case-sensitive) or compile the flow first.';
  end if;
  if v_count = 0 then
    return;
  end if;
  if array_ndims(inputs) <> 1 or array_lower(inputs, 1) <> 1
    or (idempotency_keys is not null and (cardinality(idempotency_keys) <> v_count
      or array_ndims(idempotency_keys) <> 1 or array_lower(idempotency_keys, 1) <> 1)) then
    raise exception 'start_flows needs one-dimensional arrays that start at index 1, one key per input (got % inputs, % keys).',
      v_count, coalesce(cardinality(idempotency_keys), 0)
      using errcode = '22023';
  end if;
  -- GUARD: every input is checked before anything is written.
  select i.n into v_bad from unnest(inputs) with ordinality as i (input, n)
  where i.input is null order by i.n limit 1;
  if found then
    raise exception 'Input % of the runs of flow "%" must not be SQL NULL.', v_bad.n, flow_slug
      using errcode = '22004', hint = 'Pass a JSON value; ''null''::jsonb is a valid JSON input.';
  end if;
  if v_flow.root_map is not null then
    select i.n, jsonb_typeof(i.input) as kind into v_bad from unnest(inputs) with ordinality as i (input, n)
    where jsonb_typeof(i.input) <> 'array' order by i.n limit 1;
    if found then
      -- (A lone child run's input has no position to name.)
      raise exception 'Flow "%" maps its input in step "%", so % must be a JSON array, got %.',
        flow_slug, v_flow.root_map,
        case when _start_runs.parent_run_id is not null and v_count = 1 then 'its input'
          else format('input %s', v_bad.n) end,
        v_bad.kind
        using errcode = '22023';
    end if;
  end if;

  if _start_runs.parent_run_id is not null then
    v_traceparent := pgflow._child_traceparent(_start_runs.parent_run_id, flow_slug);
    select r.priority into v_priority from pgflow.runs as r where r.run_id = _start_runs.parent_run_id;
  end if;
  if v_priority is null or v_priority not between 0 and 1000 then
    raise exception 'The priority of a run must be between 0 and 1000, got %.', coalesce(v_priority::text, 'NULL')
      using errcode = '22023', hint = '0 is the default and the lowest; the tasks of runs with a higher one are claimed first.';
  end if;

  v_ids := array(select gen_random_uuid() from generate_series(1, v_count));
  with started as (
    insert into pgflow.runs (run_id, flow_slug, input, remaining_steps, idempotency_key, traceparent,
      parent_run_id, parent_step_slug, parent_task_index, priority)
    select w.run_id, _start_runs.flow_slug, w.input, v_flow.step_count, w.key, v_traceparent,
      _start_runs.parent_run_id, _start_runs.parent_step_slug, w.task_index, v_priority
    from unnest(v_ids, inputs, coalesce(idempotency_keys, array_fill(null::text, array[v_count])),
      v_indexes)
      with ordinality as w (run_id, input, key, task_index, n)
    order by w.n
    on conflict (flow_slug, idempotency_key) where idempotency_key is not null do nothing
    returning run_id, input
  )
  select coalesce(array_agg(s.run_id), '{}'), coalesce(array_agg(s.input), '{}')
  into v_new, v_new_inputs
  from started as s;

  if cardinality(v_new) > 0 then
    -- Plain root steps start in the same statement (each has its one task, queued below). The
    -- new runs' inputs come from the insert, not from reading the runs again (engine 0026).
    insert into pgflow.step_states (run_id, flow_slug, step_slug, remaining_deps, initial_tasks,
      status, started_at, remaining_tasks)
    select r.run_id, s.flow_slug, s.step_slug, s.deps_count,
      case
        when s.step_type in ('single', 'signal', 'subflow') then 1
        when s.deps_count = 0 then jsonb_array_length(r.input)
      end,
      case when v_flow.plain and s.deps_count = 0 then 'started' else 'created' end,
      case when v_flow.plain and s.deps_count = 0 then clock_timestamp() end,
      case when v_flow.plain and s.deps_count = 0 then 1 end
    from unnest(v_new, v_new_inputs) as r (run_id, input)
    cross join pgflow.steps as s
    where s.flow_slug = _start_runs.flow_slug;
    perform pg_notify(
      'pgflow_run_' || replace(r.run_id::text, '-', ''),
      json_build_object('event', 'run:started', 'run_id', r.run_id, 'step_slug', null, 'status', 'started')::text
    )
    from unnest(v_new) as r (run_id);

    if v_flow.plain then
      -- Every root step starts with one task in every new run: one message insert per root
      -- step, its task rows paired with their messages by the task key the message carries.
      for v_root in
        select s.step_slug, s.queue_name, coalesce(s.opt_start_delay, 0) as delay, s.opt_concurrency_key
        from pgflow.steps as s
        where s.flow_slug = _start_runs.flow_slug and s.deps_count = 0
        order by s.step_index
      loop
        if v_root.opt_concurrency_key is not null then
          -- A keyed root step's tasks are parked under their key's value (engine 0018).
          perform pgflow._park_keyed_tasks(flow_slug, v_root.step_slug, v_root.queue_name,
            v_root.opt_concurrency_key, v_root.delay, v_new, array_fill(1, array[cardinality(v_new)]));
        else
          execute format(
            $q$
              with sent as (
                insert into pgmq.%I (vt, message)
                select clock_timestamp() + make_interval(secs => $1),
                  jsonb_build_object('flow_slug', $2, 'run_id', r.run_id, 'step_slug', $3, 'task_index', 0)
                    || pgflow._priority_key($6)
                from unnest($4::uuid[]) as r (run_id)
                returning msg_id, message
              )
              insert into pgflow.step_tasks (run_id, flow_slug, step_slug, task_index, message_id, queue_name)
              select (s.message ->> 'run_id')::uuid, $2, $3, 0, s.msg_id, $5
              from sent as s
            $q$,
            pgflow.pgmq_table_name(v_root.queue_name)
          )
          using v_root.delay, flow_slug, v_root.step_slug, v_new, v_root.queue_name, v_priority;
        end if;
        perform pg_notify(
          'pgflow_run_' || replace(r.run_id::text, '-', ''),
          json_build_object('event', 'step:started', 'run_id', r.run_id, 'step_slug', v_root.step_slug,
            'status', 'started')::text
        )
        from unnest(v_new) as r (run_id);
      end loop;
    else
      perform pgflow._advance_run(r.run_id) from unnest(v_new) as r (run_id);
    end if;
  end if;

  return query
  select r.*
  from unnest(v_ids, idempotency_keys) with ordinality as w (run_id, key, n)
  cross join lateral (
    select x.* from pgflow.runs as x where x.run_id = w.run_id
    union all
    select x.* from pgflow.runs as x
    where w.key is not null and x.flow_slug = _start_runs.flow_slug and x.idempotency_key = w.key
    limit 1
  ) as r
  order by w.n;
end;
$$;

-- pgflow.fork_run: source/0215_function_fork_run.sql
create or replace function pgflow.fork_run(run_id uuid, from_step text)
returns pgflow.runs
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_source pgflow.runs;
  v_changed text;
  v_unfinished record;
  v_violation text;
  v_fresh text[];
  v_run pgflow.runs;
  v_input_length int;
  v_traceparent text := substring(current_setting('pgflow.traceparent', true)
    from '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$');
begin
  select * into v_source from pgflow.runs as r where r.run_id = fork_run.run_id;
  if not found then
    raise exception 'Run % does not exist.', run_id using errcode = 'P0002';
  end if;
  perform pg_advisory_xact_lock_shared(1, hashtext(lower(v_source.flow_slug)));
  if not exists (
    select 1 from pgflow.steps as s where s.flow_slug = v_source.flow_slug and s.step_slug = from_step
  ) then
    raise exception 'Flow "%" has no step "%".', v_source.flow_slug, from_step
      using errcode = 'P0002',
        hint = format('Its steps: %s.', (select string_agg(s.step_slug, ', ' order by s.step_index)
          from pgflow.steps as s where s.flow_slug = v_source.flow_slug));
  end if;

  -- GUARD: the run's steps must still be its flow's, and its input still the flow's input.
  select coalesce(s.step_slug, ss.step_slug) into v_changed
  from (select * from pgflow.steps as x where x.flow_slug = v_source.flow_slug) as s
  full join (select * from pgflow.step_states as y where y.run_id = fork_run.run_id) as ss
    on ss.step_slug = s.step_slug
  where s.step_slug is null or ss.step_slug is null
  limit 1;
  if v_changed is not null then
    raise exception 'Run % cannot be forked: flow "%" has changed since it started.', run_id, v_source.flow_slug
      using errcode = '55000',
        detail = format('Step "%s" is in one of them only.', v_changed),
        hint = 'Nothing was changed. Start a new run instead.';
  end if;
  select pgflow.schema_violation(v_source.input, f.input_schema) into v_violation
  from pgflow.flows as f where f.flow_slug = v_source.flow_slug and f.input_schema is not null;
  if v_violation is not null then
    raise exception 'Run % cannot be forked: flow "%" no longer accepts its input.', run_id, v_source.flow_slug
      using errcode = '55000', detail = v_violation,
        hint = 'Nothing was changed. Start a new run with an input the flow accepts.';
  end if;

  -- from_step and everything downstream of it run again.
  v_fresh := array(
    with recursive down (step_slug) as (
      select fork_run.from_step
      union
      select d.step_slug from down join pgflow.deps as d
        on d.flow_slug = v_source.flow_slug and d.dep_slug = down.step_slug
    )
    select step_slug from down
  );
  -- GUARD: every other step is copied as it ended, so it must have ended well.
  select ss.step_slug, ss.status into v_unfinished
  from pgflow.step_states as ss
  join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
  where ss.run_id = fork_run.run_id and not (ss.step_slug = any (v_fresh))
    and ss.status not in ('completed', 'skipped')
  order by s.step_index
  limit 1;
  if found then
    raise exception 'Run % cannot be forked from step "%": step "%", which it would copy, is %.',
      run_id, from_step, v_unfinished.step_slug, v_unfinished.status
      using errcode = '55000',
        hint = format('Nothing was changed. Fork from step "%s" or a step before it.', v_unfinished.step_slug);
  end if;

  insert into pgflow.runs (flow_slug, input, remaining_steps, traceparent, forked_from_run_id, forked_from_step,
    priority)
  values (v_source.flow_slug, v_source.input, cardinality(v_fresh), v_traceparent, fork_run.run_id,
    fork_run.from_step, v_source.priority)
  returning * into v_run;
  if jsonb_typeof(v_source.input) = 'array' then
    v_input_length := jsonb_array_length(v_source.input);
  end if;

  -- The copied steps, as they ended; then the fresh ones, waiting for their fresh dependencies
  -- (a dependent map whose dependency is copied knows its size now).
  insert into pgflow.step_states (run_id, flow_slug, step_slug, status, output, skip_reason, error_message,
    remaining_tasks, remaining_deps, initial_tasks, created_at, started_at, completed_at, skipped_at)
  select v_run.run_id, ss.flow_slug, ss.step_slug, ss.status, ss.output, ss.skip_reason,
    case when ss.status = 'skipped' then ss.error_message end,
    case when ss.status = 'completed' then 0 end, 0, ss.initial_tasks, clock_timestamp(),
    ss.started_at, ss.completed_at, ss.skipped_at
  from pgflow.step_states as ss
  where ss.run_id = fork_run.run_id and not (ss.step_slug = any (v_fresh));
  insert into pgflow.step_states (run_id, flow_slug, step_slug, remaining_deps, initial_tasks)
  select v_run.run_id, s.flow_slug, s.step_slug,
    (select count(*) from pgflow.deps as d
     where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug and d.dep_slug = any (v_fresh))::int,
    case
      when s.step_type in ('single', 'signal', 'subflow') then 1
      when s.deps_count = 0 then v_input_length
      else (
        select case when jsonb_typeof(dep.output) = 'array' then jsonb_array_length(dep.output)
          when dep.status = 'skipped' then 0 end
        from pgflow.deps as d
        join pgflow.step_states as dep on dep.run_id = v_run.run_id and dep.step_slug = d.dep_slug
        where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug and not (d.dep_slug = any (v_fresh))
      )
    end
  from pgflow.steps as s
  where s.flow_slug = v_source.flow_slug and s.step_slug = any (v_fresh);
  -- The copied steps' completed tasks keep their outputs (a map's, one per element).
  insert into pgflow.step_tasks (run_id, flow_slug, step_slug, task_index, status, attempts_count, queue_name,
    output, queued_at, started_at, completed_at)
  select v_run.run_id, t.flow_slug, t.step_slug, t.task_index, 'completed', 0, t.queue_name, t.output,
    t.queued_at, t.started_at, t.completed_at
  from pgflow.step_tasks as t
  where t.run_id = fork_run.run_id and t.status = 'completed' and not (t.step_slug = any (v_fresh));

  perform pgflow._emit_event(v_run.run_id, 'run:started', null, 'started');
  perform pgflow._record_action('fork', v_run.flow_slug, v_run.run_id, from_step,
    jsonb_build_object('from_run', fork_run.run_id));
  perform pgflow._advance_run(v_run.run_id);
  select * into v_run from pgflow.runs as r where r.run_id = v_run.run_id;
  return v_run;
end;
$$;

-- pgflow._read_prioritised: source/0223_function_read_prioritised.sql
create function pgflow._read_prioritised(queue_name text, vt int, qty int)
returns bigint[]
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_read bigint[];
begin
  execute format(
    $q$
      with picked as (
        select m.msg_id
        from pgmq.%1$I as m
        where m.message ? 'priority' and m.vt <= clock_timestamp()
        order by (m.message ->> 'priority')::int desc, m.msg_id
        limit $2
        for update skip locked
      ),
      read as (
        update pgmq.%1$I as m
        set vt = clock_timestamp() + make_interval(secs => $1), read_ct = m.read_ct + 1
        from picked as p
        where m.msg_id = p.msg_id
        returning m.msg_id
      )
      select coalesce(array_agg(r.msg_id order by r.msg_id), '{}') from read as r
    $q$,
    pgflow.pgmq_table_name(queue_name)
  )
  into v_read
  using vt, qty;
  return v_read;
end;
$$;

-- pgflow._priority_key: source/0224_function_priority_key.sql
create function pgflow._priority_key(priority int)
returns jsonb
language sql
immutable
parallel safe
set search_path = ''
as $$
  select case when priority > 0 then jsonb_build_object('priority', priority) else '{}'::jsonb end;
$$;

-- pgflow._create_priority_index: source/0225_function_create_priority_index.sql
create function pgflow._create_priority_index(queue_name text)
returns void
language plpgsql
volatile
set search_path = ''
as $$
begin
  execute format(
    'create index if not exists %I on pgmq.%I (((message ->> ''priority'')::int) desc, msg_id)'
    ' where message ? ''priority''',
    'pgflow_priority_' || md5(queue_name), pgflow.pgmq_table_name(queue_name));
end;
$$;
-- No engine function runs for PUBLIC (engine 0019), those above included.
revoke execute on all functions in schema pgflow from public;

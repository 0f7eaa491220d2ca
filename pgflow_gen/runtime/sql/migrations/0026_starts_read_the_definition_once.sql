-- Engine migration 0026: starts read the definition once.
--
-- A start read the flow's definition in four statements (does the flow exist, its first root
-- map step, its step count, are its root steps plain) and start_flow read the run it had just
-- inserted again to return it. Now one statement reads the definition, start_flow returns the
-- row its insert returned when nothing after the insert changes the run (plain root steps;
-- a flow whose start may skip steps still reads it again), and start_flows pairs its new runs
-- with their inputs from its insert instead of reading the runs again. Same signatures, same
-- runs, rows, events and errors; about 30 us less per start inside the function (330 -> 300).

-- BEGIN HAND-WRITTEN: tables and data, applied before the functions below.
-- END HAND-WRITTEN

-- Written by `make migration` from pgflow_gen/runtime/sql/source/: edit the source, then
-- write the migration again; only the header and the hand-written section above are kept.

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

  insert into pgflow.runs (run_id, flow_slug, input, remaining_steps, idempotency_key, traceparent)
  values (v_run_id, flow_slug, input, v_flow.step_count, idempotency_key, v_traceparent)
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
      when s.step_type in ('single', 'signal') then 1
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

-- pgflow.start_flows: source/0156_function_start_flows.sql
create or replace function pgflow.start_flows(flow_slug text, inputs jsonb[], idempotency_keys text[] default null)
returns setof pgflow.runs
language plpgsql
volatile
security definer
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
  where f.flow_slug = start_flows.flow_slug
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
      raise exception 'Flow "%" maps its input in step "%", so input % must be a JSON array, got %.',
        flow_slug, v_flow.root_map, v_bad.n, v_bad.kind
        using errcode = '22023';
    end if;
  end if;

  v_ids := array(select gen_random_uuid() from generate_series(1, v_count));
  with started as (
    insert into pgflow.runs (run_id, flow_slug, input, remaining_steps, idempotency_key, traceparent)
    select w.run_id, start_flows.flow_slug, w.input, v_flow.step_count, w.key, v_traceparent
    from unnest(v_ids, inputs, coalesce(idempotency_keys, array_fill(null::text, array[v_count])))
      with ordinality as w (run_id, input, key, n)
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
        when s.step_type in ('single', 'signal') then 1
        when s.deps_count = 0 then jsonb_array_length(r.input)
      end,
      case when v_flow.plain and s.deps_count = 0 then 'started' else 'created' end,
      case when v_flow.plain and s.deps_count = 0 then clock_timestamp() end,
      case when v_flow.plain and s.deps_count = 0 then 1 end
    from unnest(v_new, v_new_inputs) as r (run_id, input)
    cross join pgflow.steps as s
    where s.flow_slug = start_flows.flow_slug;
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
        where s.flow_slug = start_flows.flow_slug and s.deps_count = 0
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
                from unnest($4::uuid[]) as r (run_id)
                returning msg_id, message
              )
              insert into pgflow.step_tasks (run_id, flow_slug, step_slug, task_index, message_id, queue_name)
              select (s.message ->> 'run_id')::uuid, $2, $3, 0, s.msg_id, $5
              from sent as s
            $q$,
            pgflow.pgmq_table_name(v_root.queue_name)
          )
          using v_root.delay, flow_slug, v_root.step_slug, v_new, v_root.queue_name;
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
    where w.key is not null and x.flow_slug = start_flows.flow_slug and x.idempotency_key = w.key
    limit 1
  ) as r
  order by w.n;
end;
$$;
-- No engine function runs for PUBLIC (engine 0019), those above included.
revoke execute on all functions in schema pgflow from public;

-- Starts many runs of one flow in one call, as start_flow would for each input in turn, and
-- returns the runs in input order: for start_flows (engine 0014), and for a subflow step's child
-- runs (engine 0028: parent_run_id and parent_step_slug name the step, parent_task_indexes each
-- run's task, and the children join the parent's trace). With idempotency_keys (one per input,
-- null elements for none), an input whose key some run of this flow already has returns that
-- run as it is and starts nothing (so does a key repeated in the call: its first input wins),
-- also when calls race. Set-based when every root step is a single step without a condition
-- (one message insert per root step for all runs); otherwise each new run moves forward as
-- start_flow moves one. An input that is SQL NULL, or not an array where a root map step maps
-- it, raises naming its position (from 1), and nothing starts; so does a subflow nested more
-- than 8 deep (54000).
-- Holds the flow's definition lock shared, as start_flow does, and keeps the caller's trace
-- context as start_flow does (engine 0016). The new runs get priority (engine 0031, refused out
-- of range as start_flow refuses it); child runs get their parent's instead.
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

-- Starts a run: one step state per step, then every ready step moves forward at once (conditions,
-- empty maps, first messages). A flow with a root map needs an array input. Returns the run.
-- Holds the flow's definition lock shared, so the definition cannot change while it is read.
-- With an idempotency_key, a run of this flow with that key is returned as it is (whatever its
-- input and status) and nothing starts; concurrent starts with one key make one run (the unique
-- index decides; under repeatable read the loser gets a serialization failure, to be retried).
-- The run keeps the caller's trace context: the transaction's `pgflow.traceparent` setting when
-- it holds a W3C traceparent (set_config('pgflow.traceparent', ..., true)); anything else is
-- ignored, never an error (engine 0016).
-- Its tasks are claimed before those of lower-priority runs in their queues (engine 0031:
-- priority 0 to 1000, 0 by default; pgflow.read_and_claim says how); a priority out of range is
-- refused (22023). A run returned for its idempotency key keeps its own priority.
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

-- Starts a new run of a run's flow with the same input from one of its steps (engine 0029): every
-- step not downstream of from_step is copied as it ended (completed with its output and its
-- tasks' outputs, or skipped with its reason; no task runs), and from_step and every step
-- downstream of it run fresh. The new run records where it came from (forked_from_run_id,
-- forked_from_step); its idempotency key is not copied, and it keeps the caller's trace context
-- as start_flow does and its priority (engine 0031). A subflow step that is copied keeps its output, not its child runs; one
-- that runs fresh starts new ones. Returns the new run.
-- Refused, changing nothing: an unknown run (P0002) or step (P0002, naming the flow's steps); a
-- run whose flow has changed since it started, or whose input its flow's input schema no longer
-- accepts, or whose steps to copy did not all complete or skip (55000, naming the first).
-- Records the operator's action ('fork', on the new run, with the old run in its detail).
-- Holds the flow's definition lock shared, as start_flow does.
create function pgflow.fork_run(run_id uuid, from_step text)
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

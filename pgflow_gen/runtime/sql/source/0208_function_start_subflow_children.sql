-- Starts a subflow step that _advance_run has just marked started (engine 0028): one task per
-- child run, written started with its first attempt (no message: no worker runs it), then the
-- child runs, all in one pgflow._start_runs call. A child's input is the step's input: the run
-- input for a root step, else the output of its one dependency (JSON null when that was
-- skipped); for a map, the element at the task's index. When some child cannot start (no such
-- flow, an input its flow refuses, nested too deep), nothing of that call stays: the children
-- start one by one instead, and each that cannot start fails its task's attempt for good
-- (pgflow._fail_attempt), which may fail the run; the rest are not started then. With
-- task_indexes (retry_run), those tasks exist and are started again: only their children
-- start. Caller holds the run row lock.
create function pgflow._start_subflow_children(run_id uuid, step_slug text, task_indexes int[] default null)
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_step record;
  v_source jsonb;
  v_indexes int[];
  v_inputs jsonb[];
  v_error text;
begin
  select s.flow_slug, s.step_type, s.subflow_slug, s.queue_name, ss.initial_tasks, r.input,
    (select d.dep_slug from pgflow.deps as d where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug) as dep
  into v_step
  from pgflow.step_states as ss
  join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
  join pgflow.runs as r on r.run_id = ss.run_id
  where ss.run_id = _start_subflow_children.run_id and ss.step_slug = _start_subflow_children.step_slug;

  if v_step.dep is null then
    v_source := v_step.input;
  else
    select ss.output into v_source from pgflow.step_states as ss
    where ss.run_id = _start_subflow_children.run_id and ss.step_slug = v_step.dep and ss.status = 'completed';
  end if;

  v_indexes := coalesce(task_indexes, array(select generate_series(0, v_step.initial_tasks - 1)));
  if task_indexes is null then
    insert into pgflow.step_tasks (run_id, flow_slug, step_slug, task_index, status, attempts_count,
      queue_name, started_at)
    select _start_subflow_children.run_id, v_step.flow_slug, _start_subflow_children.step_slug, g.n, 'started', 1,
      v_step.queue_name, clock_timestamp()
    from unnest(v_indexes) as g (n);
  end if;
  v_inputs := array(
    select case when v_step.step_type = 'map' then v_source -> g.n else coalesce(v_source, 'null') end
    from unnest(v_indexes) with ordinality as g (n, ord)
    order by g.ord
  );

  begin
    perform pgflow._start_runs(v_step.subflow_slug, v_inputs, null, run_id, step_slug, v_indexes);
    return;
  exception when no_data_found or null_value_not_allowed or invalid_parameter_value
    or program_limit_exceeded then
    null;  -- some child cannot start: one by one, below, so that only its task fails
  end;

  for i in 1 .. cardinality(v_indexes) loop
    v_error := pgflow._start_subflow_child(run_id, step_slug, v_indexes[i], v_step.subflow_slug, v_inputs[i]);
    if v_error is not null then
      perform pgflow._fail_attempt(run_id, step_slug, v_indexes[i], v_error, 'the subflow run could not start');
      -- GUARD: the failure may have closed the step or the run; then nothing more starts.
      exit when not exists (
        select 1 from pgflow.step_states as ss
        join pgflow.runs as r on r.run_id = ss.run_id and r.status = 'started'
        where ss.run_id = _start_subflow_children.run_id and ss.step_slug = _start_subflow_children.step_slug
          and ss.status = 'started'
      );
    end if;
  end loop;
end;
$$;

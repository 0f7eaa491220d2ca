-- Marks a created or started step completed with its output, counts it off the run, and tells each
-- waiting child that one dependency finished (a dependent map, whose initial_tasks is still null,
-- learns its task count from the array length). Caller holds the run row lock.
-- Called by complete_task (last task), send_signal and _advance_run (steps without tasks).
--
-- Engine 0025 writes each row once where it can. When every child of the step is a plain single
-- step (no condition, no concurrency key), a child whose last dependency this was starts in the
-- statement that counts it down, and gets its message here, as _advance_run would start it. When
-- this was the run's last step, the statement that counts it off the run completes the run, as
-- _maybe_complete_run would. Returns true when the run may still move on: a child became ready
-- that _advance_run must start (a condition, a key, a map, a signal step).
create function pgflow._complete_step(run_id uuid, step_slug text, output jsonb)
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
  returning r.remaining_steps = 0 and r.status = 'completed' as finished, r.parent_run_id into v_run;
  if v_run.finished then
    perform pgflow._emit_event(run_id, 'run:completed', null, 'completed');
    -- A subflow run completes its parent's task (engine 0028).
    if v_run.parent_run_id is not null then
      perform pgflow._settle_parent_task(run_id);
    end if;
  end if;
  return v_children.ready > 0;
end;
$$;

-- Marks a step completed with its output, counts it off the run, and tells each waiting child
-- that one dependency finished; a dependent map learns its task count from the array length.
-- Called by complete_task (last task) and _advance_run (taskless steps); caller holds the run lock.
create function pgflow._complete_step(run_id uuid, step_slug text, output jsonb)
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  -- Computed here, not inline: the planner folds functions of parameters even in CASE branches.
  v_array_length int := case when jsonb_typeof(output) = 'array' then jsonb_array_length(output) end;
begin
  update pgflow.step_states as ss
  set status = 'completed', output = _complete_step.output, remaining_tasks = 0,
    started_at = coalesce(ss.started_at, clock_timestamp()), completed_at = clock_timestamp()
  where ss.run_id = _complete_step.run_id and ss.step_slug = _complete_step.step_slug;
  perform pgflow._emit_event(run_id, 'step:completed', step_slug, 'completed');

  update pgflow.step_states as child
  set remaining_deps = child.remaining_deps - 1,
    initial_tasks = case
      when s.step_type = 'map' and child.initial_tasks is null then v_array_length
      else child.initial_tasks
    end
  from pgflow.deps as d
  join pgflow.steps as s on s.flow_slug = d.flow_slug and s.step_slug = d.step_slug
  where child.run_id = _complete_step.run_id
    and d.flow_slug = child.flow_slug and d.step_slug = child.step_slug
    and d.dep_slug = _complete_step.step_slug
    and child.status = 'created';

  update pgflow.runs as r set remaining_steps = r.remaining_steps - 1
  where r.run_id = _complete_step.run_id;
end;
$$;

-- Marks a created or started step completed with its output, counts it off the run, and tells each
-- waiting child that one dependency finished (a dependent map, whose initial_tasks is still null,
-- learns its task count from the array length). Returns true when the run may move on: a child
-- became ready or no step remains. Caller holds the run row lock.
-- Called by complete_task (last task) and _advance_run (steps without tasks).
create function pgflow._complete_step(run_id uuid, step_slug text, output jsonb)
returns boolean
language plpgsql
volatile
set search_path = ''
as $$
declare
  -- Computed here, not inline: the planner folds functions of parameters even in CASE branches.
  v_array_length int := case when jsonb_typeof(output) = 'array' then jsonb_array_length(output) end;
  v_flow_slug text;
  v_ready_children int;
  v_remaining_steps int;
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

  -- The children's slugs come from an array subquery, so the update uses the (run_id, step_slug) key.
  with children as (
    update pgflow.step_states as ss
    set remaining_deps = ss.remaining_deps - 1, initial_tasks = coalesce(ss.initial_tasks, v_array_length)
    where ss.run_id = _complete_step.run_id and ss.status = 'created'
      and ss.step_slug = any (array(
        select d.step_slug from pgflow.deps as d
        where d.flow_slug = v_flow_slug and d.dep_slug = _complete_step.step_slug
      ))
    returning ss.remaining_deps
  )
  select count(*) filter (where c.remaining_deps = 0) into v_ready_children from children as c;

  update pgflow.runs as r set remaining_steps = r.remaining_steps - 1
  where r.run_id = _complete_step.run_id
  returning r.remaining_steps into v_remaining_steps;
  return v_ready_children > 0 or v_remaining_steps = 0;
end;
$$;

-- Marks a created or started step completed with its output, counts it off the run, and tells each
-- waiting child that one dependency finished; a dependent map learns its task count from the array
-- length. Returns false when the step was no longer open. Caller holds the run row lock.
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
  v_children text[];
  v_child_is_map boolean[];
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

  -- Children are looked up first, so the update below uses the (run_id, step_slug) key.
  select array_agg(d.step_slug), array_agg(child.step_type = 'map') into v_children, v_child_is_map
  from pgflow.deps as d
  join pgflow.steps as child on child.flow_slug = d.flow_slug and child.step_slug = d.step_slug
  where d.flow_slug = v_flow_slug and d.dep_slug = _complete_step.step_slug;

  if v_children is not null then
    update pgflow.step_states as ss
    set remaining_deps = ss.remaining_deps - 1,
      initial_tasks = case when c.is_map and ss.initial_tasks is null then v_array_length else ss.initial_tasks end
    from unnest(v_children, v_child_is_map) as c (step_slug, is_map)
    where ss.run_id = _complete_step.run_id and ss.step_slug = c.step_slug and ss.status = 'created';
  end if;

  update pgflow.runs as r set remaining_steps = r.remaining_steps - 1
  where r.run_id = _complete_step.run_id;
  return true;
end;
$$;

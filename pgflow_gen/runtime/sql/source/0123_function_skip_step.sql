-- Skips one step (when_unmet or when_exhausted = skip): its unfinished tasks become skipped and
-- their messages archived; children lose one dependency, and a map child of it becomes empty.
-- Returns false when the step was no longer skippable. Caller holds the run lock.
create function pgflow._skip_step(run_id uuid, step_slug text, skip_reason text, error_message text)
returns boolean
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_queues text[];
  v_messages bigint[];
begin
  update pgflow.step_states as ss
  set status = 'skipped', skip_reason = _skip_step.skip_reason, error_message = _skip_step.error_message,
    remaining_tasks = null, skipped_at = clock_timestamp()
  where ss.run_id = _skip_step.run_id and ss.step_slug = _skip_step.step_slug
    and ss.status in ('created', 'started');
  if not found then
    return false;
  end if;

  with skipped as (
    update pgflow.step_tasks as t set status = 'skipped'
    where t.run_id = _skip_step.run_id and t.step_slug = _skip_step.step_slug
      and t.status in ('queued', 'started')
    returning t.queue_name, t.message_id
  )
  select array_agg(s.queue_name), array_agg(s.message_id) into v_queues, v_messages from skipped as s;
  perform pgflow._archive_task_messages(v_queues, v_messages);
  perform pgflow._emit_event(run_id, 'step:skipped', step_slug, 'skipped');

  update pgflow.step_states as child
  set remaining_deps = child.remaining_deps - 1,
    initial_tasks = case when s.step_type = 'map' then 0 else child.initial_tasks end
  from pgflow.deps as d
  join pgflow.steps as s on s.flow_slug = d.flow_slug and s.step_slug = d.step_slug
  where child.run_id = _skip_step.run_id
    and d.flow_slug = child.flow_slug and d.step_slug = child.step_slug
    and d.dep_slug = _skip_step.step_slug
    and child.status = 'created';

  update pgflow.runs as r set remaining_steps = r.remaining_steps - 1
  where r.run_id = _skip_step.run_id;
  return true;
end;
$$;

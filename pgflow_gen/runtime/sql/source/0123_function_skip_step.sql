-- Skips one step (when_unmet or when_exhausted = skip): its unfinished tasks become skipped (rows
-- locked in key order) and then their messages are archived; children lose one dependency, and a
-- map child of it becomes empty; a subflow step's child runs still running are cancelled (engine
-- 0028). Returns false when the step was no longer open. Caller holds the run row lock.
create function pgflow._skip_step(run_id uuid, step_slug text, skip_reason text, error_message text)
returns boolean
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_queues text[];
  v_messages bigint[];
  v_flow_slug text;
  v_child uuid;
begin
  update pgflow.step_states as ss
  set status = 'skipped', skip_reason = _skip_step.skip_reason, error_message = _skip_step.error_message,
    remaining_tasks = null, skipped_at = clock_timestamp()
  where ss.run_id = _skip_step.run_id and ss.step_slug = _skip_step.step_slug
    and ss.status in ('created', 'started')
  returning ss.flow_slug into v_flow_slug;
  if not found then
    return false;
  end if;

  with locked as (
    select t.task_index
    from pgflow.step_tasks as t
    where t.run_id = _skip_step.run_id and t.step_slug = _skip_step.step_slug
      and t.status in ('queued', 'started')
    order by t.task_index
    for update
  ),
  skipped as (
    update pgflow.step_tasks as t set status = 'skipped'
    from locked
    where t.run_id = _skip_step.run_id and t.step_slug = _skip_step.step_slug
      and t.task_index = locked.task_index and t.status in ('queued', 'started')
    returning t.queue_name, t.message_id
  )
  select array_agg(s.queue_name), array_agg(s.message_id) into v_queues, v_messages from skipped as s;
  perform pgflow._archive_task_messages(v_queues, v_messages);
  perform pgflow._emit_event(run_id, 'step:skipped', step_slug, 'skipped');
  -- A subflow step's children still running are cancelled (engine 0028).
  for v_child in
    select c.run_id from pgflow.runs as c
    where c.parent_run_id = _skip_step.run_id and c.parent_step_slug = _skip_step.step_slug
      and c.status = 'started'
    order by c.run_id
    for update
  loop
    perform pgflow._cancel_run(v_child, format('Step "%s" of its parent run %s was skipped.', step_slug, run_id));
  end loop;

  -- The children's slugs come from an array subquery, so the update uses the (run_id, step_slug) key;
  -- a map child of a skipped step has nothing to map.
  update pgflow.step_states as ss
  set remaining_deps = ss.remaining_deps - 1,
    initial_tasks = coalesce(ss.initial_tasks, 0)
  where ss.run_id = _skip_step.run_id and ss.status = 'created'
    and ss.step_slug = any (array(
      select d.step_slug from pgflow.deps as d
      where d.flow_slug = v_flow_slug and d.dep_slug = _skip_step.step_slug
    ));

  update pgflow.runs as r set remaining_steps = r.remaining_steps - 1
  where r.run_id = _skip_step.run_id;
  return true;
end;
$$;

-- Skips a step and every step downstream of it (skip-cascade): the step gets skip_reason, its
-- descendants dependency_skipped; their unfinished tasks become skipped (rows locked in key order),
-- then their messages are archived.
-- Returns how many steps it skipped (0 when already done). Caller holds the run lock.
create function pgflow._skip_step_cascade(run_id uuid, step_slug text, skip_reason text, error_message text)
returns int
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_skipped text[];
  v_queues text[];
  v_messages bigint[];
  v_slug text;
begin
  with recursive downstream (step_slug) as (
    select _skip_step_cascade.step_slug
    union
    select d.step_slug
    from downstream
    join pgflow.runs as r on r.run_id = _skip_step_cascade.run_id
    join pgflow.deps as d on d.flow_slug = r.flow_slug and d.dep_slug = downstream.step_slug
  ),
  skipped as (
    update pgflow.step_states as ss
    set status = 'skipped',
      skip_reason = case when ss.step_slug = _skip_step_cascade.step_slug
        then _skip_step_cascade.skip_reason else 'dependency_skipped' end,
      error_message = case when ss.step_slug = _skip_step_cascade.step_slug
        then _skip_step_cascade.error_message end,
      remaining_tasks = null,
      skipped_at = clock_timestamp()
    from downstream
    where ss.run_id = _skip_step_cascade.run_id and ss.step_slug = downstream.step_slug
      and ss.status in ('created', 'started')
    returning ss.step_slug
  )
  select array_agg(s.step_slug) into v_skipped from skipped as s;
  if v_skipped is null then
    return 0;
  end if;

  with locked as (
    select t.step_slug, t.task_index
    from pgflow.step_tasks as t
    where t.run_id = _skip_step_cascade.run_id and t.step_slug = any (v_skipped)
      and t.status in ('queued', 'started')
    order by t.step_slug, t.task_index
    for update
  ),
  skipped_tasks as (
    update pgflow.step_tasks as t set status = 'skipped'
    from locked
    where t.run_id = _skip_step_cascade.run_id and t.step_slug = locked.step_slug
      and t.task_index = locked.task_index and t.status in ('queued', 'started')
    returning t.queue_name, t.message_id
  )
  select array_agg(s.queue_name), array_agg(s.message_id) into v_queues, v_messages from skipped_tasks as s;
  perform pgflow._archive_task_messages(v_queues, v_messages);

  for v_slug in
    select ss.step_slug from pgflow.step_states as ss
    join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    where ss.run_id = _skip_step_cascade.run_id and ss.step_slug = any (v_skipped)
    order by s.step_index
  loop
    perform pgflow._emit_event(run_id, 'step:skipped', v_slug, 'skipped');
  end loop;

  update pgflow.runs as r set remaining_steps = r.remaining_steps - cardinality(v_skipped)
  where r.run_id = _skip_step_cascade.run_id;
  return cardinality(v_skipped);
end;
$$;

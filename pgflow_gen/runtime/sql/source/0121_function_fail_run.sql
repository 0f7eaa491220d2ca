-- Fails a started run: every queued or started task becomes cancelled (rows locked in key order)
-- and then its message is archived, so late callbacks and stale messages change nothing.
-- Its subflow runs still running fail too, and a subflow run's failure fails its parent's task
-- (engine 0028). The caller holds the run row lock.
create function pgflow._fail_run(run_id uuid)
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_queues text[];
  v_messages bigint[];
  v_parent_run_id uuid;
  v_child uuid;
begin
  update pgflow.runs as r set status = 'failed', failed_at = clock_timestamp()
  where r.run_id = _fail_run.run_id and r.status = 'started'
  returning r.parent_run_id into v_parent_run_id;
  if not found then
    return;
  end if;

  with locked as (
    select t.step_slug, t.task_index
    from pgflow.step_tasks as t
    where t.run_id = _fail_run.run_id and t.status in ('queued', 'started')
    order by t.step_slug, t.task_index
    for update
  ),
  cancelled as (
    update pgflow.step_tasks as t set status = 'cancelled'
    from locked
    where t.run_id = _fail_run.run_id and t.step_slug = locked.step_slug
      and t.task_index = locked.task_index and t.status in ('queued', 'started')
    returning t.queue_name, t.message_id
  )
  select array_agg(c.queue_name), array_agg(c.message_id) into v_queues, v_messages from cancelled as c;
  perform pgflow._archive_task_messages(v_queues, v_messages);

  perform pgflow._emit_event(run_id, 'run:failed', null, 'failed');

  -- Subflows (engine 0028): its children still running fail with it (retry_run of this run
  -- resumes them), then a subflow run's failure fails its parent's task.
  for v_child in
    select c.run_id from pgflow.runs as c
    where c.parent_run_id = _fail_run.run_id and c.status = 'started'
    order by c.run_id
    for update
  loop
    perform pgflow._fail_run(v_child);
  end loop;
  if v_parent_run_id is not null then
    perform pgflow._settle_parent_task(run_id);
  end if;
end;
$$;

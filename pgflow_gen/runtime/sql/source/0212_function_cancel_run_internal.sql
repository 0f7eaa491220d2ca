-- Cancels a started run (for cancel_run): the run becomes cancelled (with cancelled_at and the
-- reason), every step that had not finished becomes cancelled, and so does every queued or
-- started task, whose message is archived. Late callbacks of its tasks change nothing (their task
-- is no longer started), and no step of it starts again. One event, run:cancelled; and the queues
-- of the tasks that were running are told (their workers listen there), so the handlers stop.
-- Its subflow runs still running are cancelled too, and a subflow run's cancellation fails its
-- parent's task for good (engine 0028). The caller holds the run row lock and has checked that
-- the run is started. Locks its step states and its tasks, in that order, as every callback
-- does; then its children, in run id order.
create function pgflow._cancel_run(run_id uuid, reason text)
returns pgflow.runs
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_run pgflow.runs;
  v_queues text[];
  v_messages bigint[];
  v_running text[];
  v_queue text;
  v_child uuid;
begin
  perform 1 from pgflow.step_states as ss
  where ss.run_id = _cancel_run.run_id and ss.status in ('created', 'started')
  order by ss.step_slug
  for update;
  update pgflow.step_states as ss set status = 'cancelled', remaining_tasks = null
  where ss.run_id = _cancel_run.run_id and ss.status in ('created', 'started');

  with locked as (
    select t.step_slug, t.task_index, t.status
    from pgflow.step_tasks as t
    where t.run_id = _cancel_run.run_id and t.status in ('queued', 'started')
    order by t.step_slug, t.task_index
    for update
  ),
  cancelled as (
    update pgflow.step_tasks as t set status = 'cancelled'
    from locked
    where t.run_id = _cancel_run.run_id and t.step_slug = locked.step_slug
      and t.task_index = locked.task_index and t.status in ('queued', 'started')
    returning t.queue_name, t.message_id, locked.status as was
  )
  select array_agg(c.queue_name), array_agg(c.message_id),
    array_agg(distinct c.queue_name) filter (where c.was = 'started' and c.message_id is not null)
  into v_queues, v_messages, v_running
  from cancelled as c;
  perform pgflow._archive_task_messages(v_queues, v_messages);

  update pgflow.runs as r
  set status = 'cancelled', cancelled_at = clock_timestamp(), cancel_reason = _cancel_run.reason
  where r.run_id = _cancel_run.run_id
  returning * into v_run;

  perform pgflow._emit_event(run_id, 'run:cancelled', null, 'cancelled');
  -- Workers listen on their queue's insert channel; a payload tells this apart from an insert.
  foreach v_queue in array coalesce(v_running, '{}') loop
    perform pg_notify(
      'pgmq.' || pgflow.pgmq_table_name(v_queue) || '.INSERT',
      json_build_object('event', 'run:cancelled', 'run_id', run_id)::text
    );
  end loop;

  -- Subflows (engine 0028): its children still running are cancelled with it, then a subflow
  -- run's cancellation fails its parent's task.
  for v_child in
    select c.run_id from pgflow.runs as c
    where c.parent_run_id = _cancel_run.run_id and c.status = 'started'
    order by c.run_id
    for update
  loop
    perform pgflow._cancel_run(v_child, format('Its parent run %s was cancelled.', run_id));
  end loop;
  if v_run.parent_run_id is not null then
    perform pgflow._settle_parent_task(run_id);
  end if;
  return v_run;
end;
$$;

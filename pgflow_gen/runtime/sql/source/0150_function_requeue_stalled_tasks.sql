-- Recovers tasks whose worker vanished. A started task (in a started run and step) is stalled when
-- its worker is gone (marked stopped, or no heartbeat for 30 s: workers beat every 5 s) or its
-- lease ran out (started longer ago than its effective timeout + 30 s: a live worker fails a task
-- at its timeout). Never a task a live worker runs within its timeout. A stalled task is queued
-- again and its message made visible, at most 3 times; after that it is parked
-- (permanently_stalled_at) and its message archived. Skips locked tasks.
-- Also archives the completed tasks' messages still waiting in pgflow.archivable_messages.
create function pgflow.requeue_stalled_tasks()
returns int
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_requeue_queues text[];
  v_requeue_messages bigint[];
  v_park_queues text[];
  v_park_messages bigint[];
  v_queue text;
  v_ids bigint[];
begin
  -- Periodic maintenance is also where idle queues get their completed messages archived; first,
  -- before any task row is locked (the drain takes no task locks, so no order to invert).
  perform pgflow.archive_completed_messages();

  with stalled as (
    select t.run_id, t.step_slug, t.task_index
    from pgflow.step_tasks as t
    join pgflow.runs as r on r.run_id = t.run_id and r.status = 'started'
    join pgflow.step_states as ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug and ss.status = 'started'
    join pgflow.steps as s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug
    join pgflow.flows as f on f.flow_slug = t.flow_slug
    where t.status = 'started' and t.permanently_stalled_at is null
      and (
        t.started_at < clock_timestamp() - make_interval(secs => coalesce(s.opt_timeout, f.opt_timeout) + 30)
        or not exists (
          select 1 from pgflow.workers as w
          where w.worker_id = t.last_worker_id and w.stopped_at is null
            and w.last_heartbeat_at > clock_timestamp() - interval '30 seconds'
        )
      )
    for update of t skip locked
  ),
  changed as (
    update pgflow.step_tasks as t
    set status = case when t.requeued_count < 3 then 'queued' else t.status end,
      started_at = case when t.requeued_count < 3 then null else t.started_at end,
      last_worker_id = case when t.requeued_count < 3 then null else t.last_worker_id end,
      requeued_count = case when t.requeued_count < 3 then t.requeued_count + 1 else t.requeued_count end,
      last_requeued_at = case when t.requeued_count < 3 then clock_timestamp() else t.last_requeued_at end,
      permanently_stalled_at = case when t.requeued_count < 3 then null else clock_timestamp() end
    from stalled
    where t.run_id = stalled.run_id and t.step_slug = stalled.step_slug and t.task_index = stalled.task_index
    returning t.queue_name, t.message_id, t.status = 'queued' as requeued
  )
  select array_agg(c.queue_name) filter (where c.requeued), array_agg(c.message_id) filter (where c.requeued),
    array_agg(c.queue_name) filter (where not c.requeued), array_agg(c.message_id) filter (where not c.requeued)
  into v_requeue_queues, v_requeue_messages, v_park_queues, v_park_messages
  from changed as c;

  -- Requeued tasks become visible at once; parked ones leave the queue.
  for v_queue in select distinct q from unnest(v_requeue_queues) as q loop
    v_ids := array(select x.m from unnest(v_requeue_queues, v_requeue_messages) as x (q, m) where x.q = v_queue);
    perform pgflow.set_vt_batch(v_queue, v_ids, array_fill(0, array[cardinality(v_ids)]));
  end loop;
  perform pgflow._archive_task_messages(v_park_queues, v_park_messages);
  return coalesce(cardinality(v_requeue_messages), 0);
end;
$$;

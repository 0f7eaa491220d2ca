-- Archives the recorded messages of completed tasks, one pgmq.archive call per queue (one queue,
-- or all when queue_name is null). Returns how many it archived. Touches no task rows.
-- Called by start_tasks, requeue_stalled_tasks and prune_data_older_than.
create function pgflow.archive_completed_messages(queue_name text default null)
returns int
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_queues text[];
  v_messages bigint[];
begin
  with drained as (
    delete from pgflow.archivable_messages as m
    where archive_completed_messages.queue_name is null
       or m.queue_name = archive_completed_messages.queue_name
    returning m.queue_name, m.message_id
  )
  select array_agg(d.queue_name), array_agg(d.message_id) into v_queues, v_messages from drained as d;
  if v_messages is null then
    return 0;
  end if;
  perform pgflow._archive_task_messages(v_queues, v_messages);
  return cardinality(v_messages);
end;
$$;

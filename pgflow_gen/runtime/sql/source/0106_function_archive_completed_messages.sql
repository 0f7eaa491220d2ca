-- Archives the recorded messages of completed tasks, one pgmq.archive call per queue (one queue,
-- or all when queue_name is null). Returns how many it archived. Touches no task rows.
-- Called by start_tasks (its queue), requeue_stalled_tasks and prune_data_older_than (all queues).
create function pgflow.archive_completed_messages(queue_name text default null)
returns int
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_queue text;
  v_messages bigint[];
  v_total int := 0;
begin
  for v_queue in
    select distinct m.queue_name from pgflow.archivable_messages as m
    where archive_completed_messages.queue_name is null
  loop
    v_total := v_total + pgflow.archive_completed_messages(v_queue);
  end loop;
  if archive_completed_messages.queue_name is null then
    return v_total;
  end if;

  with drained as (
    delete from pgflow.archivable_messages as m
    where m.queue_name = archive_completed_messages.queue_name
    returning m.message_id
  )
  select array_agg(d.message_id) into v_messages from drained as d;
  if v_messages is null then
    return 0;
  end if;
  perform pgmq.archive(queue_name, v_messages);
  return cardinality(v_messages);
end;
$$;

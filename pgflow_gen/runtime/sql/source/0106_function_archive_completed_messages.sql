-- Archives the recorded messages of completed tasks, one pgmq.archive call per queue (one queue,
-- or all when queue_name is null, in queue order). Rows another drainer holds are skipped, so
-- drains never wait on each other; rows of a queue that no longer exists are discarded.
-- Touches no task rows. Called by requeue_stalled_tasks, pruning and delete_flow_and_data (and,
-- until engine 0014, by every claim for its queue).
create function pgflow.archive_completed_messages(queue_name text default null)
returns int
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_queue text;
  v_messages bigint[];
  v_total int := 0;
begin
  if archive_completed_messages.queue_name is null then
    for v_queue in
      select distinct m.queue_name from pgflow.archivable_messages as m order by 1
    loop
      v_total := v_total + pgflow.archive_completed_messages(v_queue);
    end loop;
    return v_total;
  end if;

  with picked as (
    select m.message_id
    from pgflow.archivable_messages as m
    where m.queue_name = archive_completed_messages.queue_name
    order by m.message_id
    for update skip locked
  ),
  drained as (
    delete from pgflow.archivable_messages as m
    using picked
    where m.queue_name = archive_completed_messages.queue_name and m.message_id = picked.message_id
    returning m.message_id
  )
  select array_agg(d.message_id) into v_messages from drained as d;
  if v_messages is null then
    return 0;
  end if;
  if exists (select 1 from pgmq.meta as q where q.queue_name = archive_completed_messages.queue_name) then
    perform pgmq.archive(queue_name, v_messages);
  end if;
  return cardinality(v_messages);
end;
$$;

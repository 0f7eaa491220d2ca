-- Archives task messages that may live in several queues, one pgmq.archive call per queue.
-- Callers pass the (queue_name, message_id) pairs of step_tasks rows they already updated.
create function pgflow._archive_task_messages(queue_names text[], message_ids bigint[])
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_queue text;
begin
  for v_queue in select distinct q from unnest(queue_names) as q loop
    perform pgflow._archive_messages(v_queue, array(
      select m.message_id
      from unnest(queue_names, message_ids) as m (queue_name, message_id)
      where m.queue_name = v_queue and m.message_id is not null
    ));
  end loop;
end;
$$;

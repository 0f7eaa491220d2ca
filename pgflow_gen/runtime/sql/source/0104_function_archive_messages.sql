-- Archives the given messages of one queue (no-op for an empty list or already archived ids).
-- Callers hold the step_tasks rows of these messages first (lock order: tasks, then PGMQ rows).
create function pgflow._archive_messages(queue_name text, msg_ids bigint[])
returns void
language plpgsql
volatile
set search_path = ''
as $$
begin
  if msg_ids is null or cardinality(msg_ids) = 0 then
    return;
  end if;
  perform pgmq.archive(queue_name, msg_ids);
end;
$$;

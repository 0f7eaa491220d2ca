-- The insert notification of a queue (engine 0013), a statement trigger function: one pg_notify
-- per statement that inserts messages, on the channel PGMQ's own trigger uses
-- (pgmq.<queue table>.INSERT, no payload), so listeners of every release hear it. Installed by
-- pgflow.enable_insert_notifications.
create function pgflow._notify_queue_insert()
returns trigger
language plpgsql
set search_path = ''
as $$
begin
  perform pg_notify('pgmq.' || tg_table_name || '.INSERT', null);
  return null;
end;
$$;

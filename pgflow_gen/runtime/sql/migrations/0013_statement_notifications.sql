-- Engine migration 0013: insert notifications that cost one notify per statement.
--
-- pgflow.enable_insert_notifications(queue_name) gives a queue a statement trigger that sends one
-- notification per inserting statement, on the channel PGMQ's own trigger uses, and drops PGMQ's
-- per-row trigger, whose per-message update of one throttle row made a map's fan-out of N
-- messages cost O(N^2). The migration does it for every queue that has PGMQ's trigger now.
-- Workers of this release call it at startup; workers of earlier releases keep listening on the
-- same channel, and find the throttle row they look for, so they add no row trigger again.

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

-- Makes inserts into a queue wake its listeners with one notification per statement (engine
-- 0013; the trigger pgflow_notify_insert runs pgflow._notify_queue_insert), in place of PGMQ's
-- per-row trigger (pgmq.enable_notify_insert), which it drops where one was made: that trigger
-- updates one throttle row per message, so a statement that inserts N messages (a map's fan-out)
-- cost O(N^2) as each update walked the row versions the statement made before. Keeps PGMQ's
-- throttle row of the queue where PGMQ has that table, so that a worker of an earlier release,
-- which looks for the row, does not add its trigger again. Idempotent; returns whether it
-- changed anything. Workers call it at startup, one at a time (an advisory lock).
create function pgflow.enable_insert_notifications(queue_name text)
returns boolean
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_queue text := lower(queue_name);
  v_table regclass := to_regclass(format('pgmq.%I', pgflow.pgmq_table_name(queue_name)));
  v_changed boolean := false;
begin
  if v_table is null then
    raise exception 'Queue "%" does not exist.', v_queue using errcode = '42P01';
  end if;
  if exists (
    select 1 from pg_catalog.pg_trigger as t
    where t.tgrelid = v_table and t.tgname = 'trigger_notify_queue_insert_listeners'
  ) then
    execute format('drop trigger trigger_notify_queue_insert_listeners on %s', v_table);
    v_changed := true;
  end if;
  if not exists (
    select 1 from pg_catalog.pg_trigger as t
    where t.tgrelid = v_table and t.tgname = 'pgflow_notify_insert'
  ) then
    execute format(
      'create trigger pgflow_notify_insert after insert on %s'
      ' for each statement execute function pgflow._notify_queue_insert()', v_table);
    v_changed := true;
  end if;
  if to_regclass('pgmq.notify_insert_throttle') is not null then
    execute 'insert into pgmq.notify_insert_throttle (queue_name, throttle_interval_ms)'
      ' select $1, 0 where not exists'
      ' (select 1 from pgmq.notify_insert_throttle as n where n.queue_name = $1)'
      using v_queue;
  end if;
  return v_changed;
end;
$$;

-- The queues that notify through PGMQ's per-row trigger now.
do $$
declare
  v_queue text;
begin
  for v_queue in
    select q.queue_name from pgmq.meta as q
    where exists (
      select 1 from pg_catalog.pg_trigger as t
      where t.tgrelid = to_regclass(format('pgmq.%I', pgflow.pgmq_table_name(q.queue_name)))
        and t.tgname = 'trigger_notify_queue_insert_listeners'
    )
    order by q.queue_name
  loop
    perform pgflow.enable_insert_notifications(v_queue);
  end loop;
end;
$$;

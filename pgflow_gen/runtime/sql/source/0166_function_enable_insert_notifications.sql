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
security definer
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
  perform pgflow._require_queue_route(v_queue);
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

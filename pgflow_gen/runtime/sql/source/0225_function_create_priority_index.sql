-- Gives a pgflow queue the index of its prioritised messages (engine 0031): those with a
-- "priority" key (pgflow._priority_key), the highest first and the oldest first among equals,
-- the order of pgflow._read_prioritised. Partial, so messages without a priority never enter
-- it. Named after the queue's md5 (pgflow_priority_<md5>), in the queue's schema; created once.
-- Called where flows create their queues, and by migration 0031 for the queues before it.
create function pgflow._create_priority_index(queue_name text)
returns void
language plpgsql
volatile
set search_path = ''
as $$
begin
  execute format(
    'create index if not exists %I on pgmq.%I (((message ->> ''priority'')::int) desc, msg_id)'
    ' where message ? ''priority''',
    'pgflow_priority_' || md5(queue_name), pgflow.pgmq_table_name(queue_name));
end;
$$;

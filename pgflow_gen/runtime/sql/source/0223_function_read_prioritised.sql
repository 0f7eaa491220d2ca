-- The read of a claim that comes before the first-in-first-out one (engine 0031): up to qty
-- visible messages of queue_name that carry a priority (pgflow._priority_key), the highest
-- first and, among equals, the oldest first. Each is hidden for vt seconds and its read count
-- goes up, as pgmq.read does; locked messages are skipped, as pgmq.read skips them. Returns
-- their ids. It walks the queue's index of prioritised messages
-- (pgflow._create_priority_index), which holds no message of a run without a priority.
create function pgflow._read_prioritised(queue_name text, vt int, qty int)
returns bigint[]
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_read bigint[];
begin
  execute format(
    $q$
      with picked as (
        select m.msg_id
        from pgmq.%1$I as m
        where m.message ? 'priority' and m.vt <= clock_timestamp()
        order by (m.message ->> 'priority')::int desc, m.msg_id
        limit $2
        for update skip locked
      ),
      read as (
        update pgmq.%1$I as m
        set vt = clock_timestamp() + make_interval(secs => $1), read_ct = m.read_ct + 1
        from picked as p
        where m.msg_id = p.msg_id
        returning m.msg_id
      )
      select coalesce(array_agg(r.msg_id order by r.msg_id), '{}') from read as r
    $q$,
    pgflow.pgmq_table_name(queue_name)
  )
  into v_read
  using vt, qty;
  return v_read;
end;
$$;

-- Sets the visibility of several messages of one queue in one statement (PGMQ has no batched
-- set_vt with per-message offsets). Unknown ids are ignored; callers compare the returned rows.
-- Locks the PGMQ rows it updates: callers must already hold the matching step_tasks rows. The
-- engine's own callers use it; sessions call pgflow.set_vt_batch, which checks the queue first.
create function pgflow._set_vt_batch(queue_name text, msg_ids bigint[], vt_offsets int[])
returns table (msg_id bigint, vt timestamptz)
language plpgsql
volatile
set search_path = ''
as $$
begin
  if msg_ids is null or cardinality(msg_ids) = 0 then
    return;
  end if;
  if cardinality(msg_ids) <> coalesce(cardinality(vt_offsets), 0) then
    raise exception 'set_vt_batch: % message ids but % offsets',
      cardinality(msg_ids), coalesce(cardinality(vt_offsets), 0);
  end if;
  return query execute format(
    $q$
      update pgmq.%I as q
      set vt = clock_timestamp() + make_interval(secs => v.vt_offset)
      from unnest($1, $2) as v (msg_id, vt_offset)
      -- The redundant "= any" lets the planner use the queue's primary key instead of a scan.
      where q.msg_id = v.msg_id and q.msg_id = any ($1)
      returning q.msg_id, q.vt
    $q$,
    pgflow.pgmq_table_name(queue_name)
  ) using msg_ids, vt_offsets;
end;
$$;

-- Sets the visibility of several messages of one engine queue, each with its own offset in seconds
-- (pgflow._set_vt_batch), for a worker that read messages it hands back: refuses a queue that is
-- no engine queue, or another step's queue for a step role (pgflow._require_queue_route).
-- Locks the PGMQ rows it updates.
create function pgflow.set_vt_batch(queue_name text, msg_ids bigint[], vt_offsets int[])
returns table (msg_id bigint, vt timestamptz)
language plpgsql
volatile
security definer
set search_path = ''
as $$
begin
  perform pgflow._require_queue_route(queue_name);
  return query select * from pgflow._set_vt_batch(queue_name, msg_ids, vt_offsets);
end;
$$;

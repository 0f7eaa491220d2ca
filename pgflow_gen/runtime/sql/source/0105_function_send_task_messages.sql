-- Enqueues one message per task index of a step and returns which message id each task got.
-- Messages carry only the task key. Inserting into the queue table directly (as pgmq.send_batch
-- does) lets RETURNING pair every id with its task_index without relying on row order.
create function pgflow._send_task_messages(
  queue_name text,
  flow_slug text,
  run_id uuid,
  step_slug text,
  task_count int,
  delay_seconds int
)
returns table (task_index int, message_id bigint)
language plpgsql
volatile
set search_path = ''
as $$
begin
  return query execute format(
    $q$
      insert into pgmq.%I (vt, message)
      select clock_timestamp() + make_interval(secs => $5),
             jsonb_build_object('flow_slug', $1, 'run_id', $2, 'step_slug', $3, 'task_index', i)
      from generate_series(0, $4 - 1) as i
      returning (message ->> 'task_index')::int, msg_id
    $q$,
    'q_' || lower(queue_name)
  ) using flow_slug, run_id, step_slug, task_count, delay_seconds;
end;
$$;

-- A worker process announces itself and the one queue it polls (and, for a step worker, its flow
-- and step). Re-registering the same worker id refreshes it. Called once at worker startup.
create function pgflow.register_worker(
  worker_id uuid,
  queue_name text,
  function_name text,
  flow_slug text default null,
  step_slug text default null
)
returns pgflow.workers
language sql
volatile
set search_path = ''
as $$
  insert into pgflow.workers as w (worker_id, queue_name, function_name, flow_slug, step_slug)
  values (worker_id, queue_name, function_name, flow_slug, step_slug)
  on conflict (worker_id) do update
  set queue_name = excluded.queue_name, function_name = excluded.function_name,
    flow_slug = excluded.flow_slug, step_slug = excluded.step_slug,
    last_heartbeat_at = clock_timestamp(), stopped_at = null
  returning w.*
$$;

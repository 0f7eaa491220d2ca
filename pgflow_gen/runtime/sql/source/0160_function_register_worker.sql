-- A worker process announces itself and the one queue it polls (and, for a step worker, its flow
-- and step). Re-registering the same worker id refreshes it. Called once at worker startup. A step
-- role (pgflow.step_roles) registers only for its own step and that step's queue.
create function pgflow.register_worker(
  worker_id uuid,
  queue_name text,
  function_name text,
  flow_slug text default null,
  step_slug text default null
)
returns pgflow.workers
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_worker pgflow.workers;
begin
  perform pgflow._require_step_route(flow_slug, step_slug);
  if pgflow._session_is_step_role() then
    perform pgflow._require_queue_route(queue_name);
  end if;
  insert into pgflow.workers as w (worker_id, queue_name, function_name, flow_slug, step_slug)
  values (register_worker.worker_id, register_worker.queue_name, register_worker.function_name,
    register_worker.flow_slug, register_worker.step_slug)
  on conflict on constraint workers_pkey do update
  set queue_name = excluded.queue_name, function_name = excluded.function_name,
    flow_slug = excluded.flow_slug, step_slug = excluded.step_slug,
    last_heartbeat_at = clock_timestamp(), stopped_at = null
  returning w.* into v_worker;
  return v_worker;
end;
$$;

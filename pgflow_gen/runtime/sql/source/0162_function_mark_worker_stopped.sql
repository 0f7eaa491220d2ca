-- Records that a worker stopped (after draining). Idempotent. Called at worker shutdown; a step
-- role (pgflow.step_roles) stops only its own step's workers.
create function pgflow.mark_worker_stopped(worker_id uuid)
returns void
language plpgsql
volatile
security definer
set search_path = ''
as $$
begin
  perform pgflow._require_worker_route(worker_id);
  update pgflow.workers as w set stopped_at = coalesce(w.stopped_at, clock_timestamp())
  where w.worker_id = mark_worker_stopped.worker_id;
end;
$$;

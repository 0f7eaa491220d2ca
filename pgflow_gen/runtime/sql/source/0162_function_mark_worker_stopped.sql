-- Records that a worker stopped (after draining). Idempotent. Called at worker shutdown.
create function pgflow.mark_worker_stopped(worker_id uuid)
returns void
language sql
volatile
set search_path = ''
as $$
  update pgflow.workers as w set stopped_at = coalesce(w.stopped_at, clock_timestamp())
  where w.worker_id = mark_worker_stopped.worker_id
$$;

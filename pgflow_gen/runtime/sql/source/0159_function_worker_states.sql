-- Every registered worker with its state by the liveness rule, the one place that decides it:
-- stopped (marked so), deprecated (a newer deploy replaced it), live while its last heartbeat is
-- younger than `live_within` (default: pgflow.worker_liveness()'s), else stale. queue_coverage
-- (`coverage`, `status`, the dashboard's routes), `pgflow-gen workers`, the dashboard's workers page
-- and the metrics all read it. No writes.
create function pgflow.worker_states(
  live_within interval default (pgflow.worker_liveness()).live_within
)
returns table (
  worker_id uuid,
  function_name text,
  flow_slug text,
  step_slug text,
  queue_name text,
  started_at timestamptz,
  last_heartbeat_at timestamptz,
  stopped_at timestamptz,
  deprecated_at timestamptz,
  state text
)
language sql
stable
security definer
set search_path = ''
as $$
  select w.worker_id, w.function_name, w.flow_slug, w.step_slug, w.queue_name, w.started_at,
    w.last_heartbeat_at, w.stopped_at, w.deprecated_at,
    case
      when w.stopped_at is not null then 'stopped'
      when w.deprecated_at is not null then 'deprecated'
      when w.last_heartbeat_at > now() - worker_states.live_within then 'live'
      else 'stale'
    end
  from pgflow.workers as w
$$;

-- Engine migration 0022: the state of a worker (live, stale, deprecated, stopped) is decided in one
-- place, pgflow.worker_states.
--
-- The rule was spelled three times: in pgflow.queue_coverage (`coverage`, `status`, the
-- dashboard's routes) and in the statement behind `pgflow-gen workers`, the dashboard's workers
-- page and the metrics. pgflow.worker_states(live_within) returns every registered worker with its
-- state; queue_coverage now counts the workers it calls live, and the Python statements read it.
-- No table changes; queue_coverage keeps its signature and results.

-- BEGIN HAND-WRITTEN: tables and data, applied before the functions below.
-- END HAND-WRITTEN

-- Written by `make migration` from pgflow_gen/runtime/sql/source/: edit the source, then
-- write the migration again; only the header and the hand-written section above are kept.

-- pgflow.worker_states: source/0159_function_worker_states.sql
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

-- pgflow.queue_coverage: source/0163_function_queue_coverage.sql
create or replace function pgflow.queue_coverage(freshness interval default (pgflow.worker_liveness()).live_within)
returns table (
  flow_slug text,
  step_slug text,
  step_index int,
  queue_name text,
  live_workers int,
  covered boolean
)
language sql
stable
security definer
set search_path = ''
as $$
  select s.flow_slug, s.step_slug, s.step_index, s.queue_name,
    count(w.worker_id)::int, count(w.worker_id) > 0
  from pgflow.steps as s
  left join pgflow.worker_states(queue_coverage.freshness) as w
    on w.queue_name = s.queue_name and w.state = 'live'
  where s.step_type <> 'signal'
  group by s.flow_slug, s.step_slug, s.step_index, s.queue_name
  order by s.flow_slug, s.step_index
$$;
-- No engine function runs for PUBLIC (engine 0019), those above included.
revoke execute on all functions in schema pgflow from public;

-- Which queue routes have a live worker right now: every persisted step route, left-joined to the
-- workers registered on exactly that queue that pgflow.worker_states calls live within
-- `freshness` (default: the liveness rule's live_within, 15 s, three heartbeats).
-- Several live instances are one covered route. A point-in-time check, run after a deployment.
-- Signal steps are left out: they run no task, so no worker serves them.
create function pgflow.queue_coverage(freshness interval default (pgflow.worker_liveness()).live_within)
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
  where s.step_type <> 'signal' and s.subflow_slug is null
  group by s.flow_slug, s.step_slug, s.step_index, s.queue_name
  order by s.flow_slug, s.step_index
$$;

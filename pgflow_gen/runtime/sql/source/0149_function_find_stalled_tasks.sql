-- The stall rule, read by requeue_stalled_tasks: the started tasks (of started runs and steps, not
-- parked) whose worker is gone (marked stopped, or no heartbeat within the liveness rule's
-- stalled_after) or whose lease ran out (started, or last renewed by its worker while it holds
-- a result it cannot send yet, longer ago than the timeout it was claimed with + stalled_after:
-- a live worker ends an attempt at its timeout). A subflow step's tasks have no worker: their child
-- runs end them (engine 0028). Takes no locks; sees the calling statement's
-- snapshot.
create function pgflow.find_stalled_tasks()
returns table (run_id uuid, step_slug text, task_index int)
language sql
stable
security definer
set search_path = ''
as $$
  select t.run_id, t.step_slug, t.task_index
  from pgflow.worker_liveness() as l,
    pgflow.step_tasks as t
    join pgflow.runs as r on r.run_id = t.run_id and r.status = 'started'
    join pgflow.step_states as ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug and ss.status = 'started'
    join pgflow.steps as s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug
    join pgflow.flows as f on f.flow_slug = t.flow_slug
  where t.status = 'started' and t.permanently_stalled_at is null and s.subflow_slug is null
    and (
      coalesce(t.lease_renewed_at, t.started_at) < clock_timestamp()
        - make_interval(secs => coalesce(t.claimed_timeout, s.opt_timeout, f.opt_timeout)) - l.stalled_after
      or not exists (
        select 1 from pgflow.workers as w
        where w.worker_id = t.last_worker_id and w.stopped_at is null
          and w.last_heartbeat_at > clock_timestamp() - l.stalled_after
      )
    )
$$;

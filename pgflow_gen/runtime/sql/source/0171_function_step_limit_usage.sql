-- Every limited step (of one flow, or of all) with its limits and their use now (engine 0017):
-- tasks in flight against max_in_flight, task starts in the last rate_period_s seconds against
-- rate_limit. Reads only the limited steps' slots; locks nothing. For status, coverage, the
-- dashboard and metrics.
create function pgflow.step_limit_usage(flow_slug text default null)
returns table (
  flow_slug text,
  step_slug text,
  queue_name text,
  max_in_flight int,
  rate_limit int,
  rate_period_s int,
  set_by text,
  in_flight bigint,
  window_starts bigint,
  updated_at timestamptz
)
language sql
stable
security definer
set search_path = ''
as $$
  select l.flow_slug, l.step_slug, s.queue_name, l.max_in_flight, l.rate_limit, l.rate_period_s,
    l.set_by,
    (select count(*) from pgflow.step_slots as x
     join pgflow.step_tasks as t on t.run_id = x.run_id and t.step_slug = x.step_slug
       and t.task_index = x.task_index
     where x.flow_slug = l.flow_slug and x.step_slug = l.step_slug
       and t.status = 'started' and t.attempts_count = x.attempt),
    (select count(*) from pgflow.step_slots as x
     where x.flow_slug = l.flow_slug and x.step_slug = l.step_slug and l.rate_period_s is not null
       and x.started_at > now() - make_interval(secs => l.rate_period_s)),
    l.updated_at
  from pgflow.step_limits as l
  join pgflow.steps as s on s.flow_slug = l.flow_slug and s.step_slug = l.step_slug
  where step_limit_usage.flow_slug is null or l.flow_slug = step_limit_usage.flow_slug
  order by l.flow_slug, s.step_index;
$$;

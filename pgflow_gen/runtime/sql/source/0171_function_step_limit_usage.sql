-- Every limited step (of one flow, or of all) with its limits and their use now (engine 0017):
-- tasks in flight against max_in_flight, task starts in the last rate_period_s seconds against
-- rate_limit. Since engine 0023 also the spec's limits (spec_*) and, when an operator's override
-- stands (pgflow.step_limit_overrides), when and by whom it was set: a step whose override
-- lifts every limit is listed too. Reads only the limited steps' slots; locks nothing. For status,
-- coverage, the dashboard and metrics.
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
  updated_at timestamptz,
  spec_max_in_flight int,
  spec_rate_limit int,
  spec_rate_period_s int,
  overridden_at timestamptz,
  overridden_by text
)
language sql
stable
security definer
set search_path = ''
as $$
  select s.flow_slug, s.step_slug, s.queue_name, l.max_in_flight, l.rate_limit, l.rate_period_s,
    case when v.flow_slug is not null then 'operator' else l.set_by end,
    (select count(*) from pgflow.step_slots as x
     join pgflow.step_tasks as t on t.run_id = x.run_id and t.step_slug = x.step_slug
       and t.task_index = x.task_index
     where x.flow_slug = s.flow_slug and x.step_slug = s.step_slug
       and t.status = 'started' and t.attempts_count = x.attempt),
    (select count(*) from pgflow.step_slots as x
     where x.flow_slug = s.flow_slug and x.step_slug = s.step_slug and l.rate_period_s is not null
       and x.started_at > now() - make_interval(secs => l.rate_period_s)),
    coalesce(l.updated_at, v.set_at),
    s.opt_max_in_flight, s.opt_rate_limit, s.opt_rate_period, v.set_at, v.actor
  from pgflow.steps as s
  left join pgflow.step_limits as l on l.flow_slug = s.flow_slug and l.step_slug = s.step_slug
  left join pgflow.step_limit_overrides as v on v.flow_slug = s.flow_slug and v.step_slug = s.step_slug
  where (l.flow_slug is not null or v.flow_slug is not null)
    and (step_limit_usage.flow_slug is null or s.flow_slug = step_limit_usage.flow_slug)
  order by s.flow_slug, s.step_index;
$$;

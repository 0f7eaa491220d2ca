-- Sets a step's limits, live, for every worker (engine 0017): at most max_in_flight of its tasks
-- started at once, and at most rate_limit task starts in any rate_period_s seconds (each attempt
-- and each map element counts). Null clears a limit; all null clears the step's limits. Messages
-- beyond a limit are not started, use no attempt, and are read again once there is room. A limit
-- set here stays until changed here, unless the flow's spec limits this step itself (applying its
-- migration sets the spec's). Returns the limits; null when cleared. A signal step runs no task and
-- takes no limit.
create function pgflow.set_step_limits(
  flow_slug text,
  step_slug text,
  max_in_flight int default null,
  rate_limit int default null,
  rate_period_s int default null
)
returns pgflow.step_limits
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_limits pgflow.step_limits;
begin
  perform pgflow._require_step(flow_slug, step_slug);
  if exists (
    select 1 from pgflow.steps as s
    where s.flow_slug = set_step_limits.flow_slug and s.step_slug = set_step_limits.step_slug
      and s.step_type = 'signal'
  ) then
    raise exception 'Step "%" of flow "%" is a signal step: it runs no task, so there is nothing to limit.',
      step_slug, flow_slug
      using errcode = '22023', hint = 'Limit the steps that depend on it instead.';
  end if;
  v_limits := pgflow._put_step_limits(flow_slug, step_slug, max_in_flight, rate_limit, rate_period_s, 'operator');
  perform pgflow._record_action('limits', flow_slug, null, step_slug, jsonb_build_object(
    'max_in_flight', max_in_flight, 'rate_limit', rate_limit, 'rate_period_s', rate_period_s));
  return v_limits;
end;
$$;

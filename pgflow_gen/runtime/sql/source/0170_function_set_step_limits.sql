-- Sets a step's limits, live, for every worker (engine 0017): at most max_in_flight of its tasks
-- started at once, and at most rate_limit task starts in any rate_period_s seconds (each attempt
-- and each map element counts). Null clears a limit; all null clears the step's limits. Messages
-- beyond a limit are not started, use no attempt, and are read again once there is room. Since
-- engine 0023 the limits set here override the spec's (pgflow.step_limit_overrides, clearing
-- included) and stay through worker starts and migrations until pgflow.reset_step_limits; none
-- over a spec that sets none is no override. Returns the limits; null when cleared. A signal step
-- runs no task and takes no limit, nor does a subflow step (engine 0028). Locks the step's row, so an override and the spec's limits (a
-- flow's options, pgflow._apply_flow_options) never cross.
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
  perform 1 from pgflow.steps as s
  where s.flow_slug = set_step_limits.flow_slug and s.step_slug = set_step_limits.step_slug
  for no key update;
  if exists (
    select 1 from pgflow.steps as s
    where s.flow_slug = set_step_limits.flow_slug and s.step_slug = set_step_limits.step_slug
      and s.step_type = 'signal'
  ) then
    raise exception 'Step "%" of flow "%" is a signal step: it runs no task, so there is nothing to limit.',
      step_slug, flow_slug
      using errcode = '22023', hint = 'Limit the steps that depend on it instead.';
  end if;
  if exists (
    select 1 from pgflow.steps as s
    where s.flow_slug = set_step_limits.flow_slug and s.step_slug = set_step_limits.step_slug
      and s.subflow_slug is not null
  ) then
    raise exception 'Step "%" of flow "%" is a subflow step: its tasks are child runs, so there is nothing to limit.',
      step_slug, flow_slug
      using errcode = '22023', hint = 'Limit the steps of its subflow instead.';
  end if;
  v_limits := pgflow._put_step_limits(flow_slug, step_slug, max_in_flight, rate_limit, rate_period_s, 'operator');
  if v_limits is null and not exists (
    select 1 from pgflow.steps as s
    where s.flow_slug = set_step_limits.flow_slug and s.step_slug = set_step_limits.step_slug
      and (s.opt_max_in_flight is not null or s.opt_rate_limit is not null)
  ) then
    delete from pgflow.step_limit_overrides as o
    where o.flow_slug = set_step_limits.flow_slug and o.step_slug = set_step_limits.step_slug;
  else
    insert into pgflow.step_limit_overrides as o
      (flow_slug, step_slug, max_in_flight, rate_limit, rate_period_s, set_at, actor, label)
    values (set_step_limits.flow_slug, set_step_limits.step_slug, set_step_limits.max_in_flight,
      set_step_limits.rate_limit, set_step_limits.rate_period_s, now(), session_user,
      left(nullif(current_setting('pgflow.action_label', true), ''), 200))
    on conflict on constraint step_limit_overrides_pkey do update
    set max_in_flight = excluded.max_in_flight, rate_limit = excluded.rate_limit,
      rate_period_s = excluded.rate_period_s, set_at = excluded.set_at, actor = excluded.actor,
      label = excluded.label;
  end if;
  perform pgflow._record_action('limits', flow_slug, null, step_slug, jsonb_build_object(
    'max_in_flight', max_in_flight, 'rate_limit', rate_limit, 'rate_period_s', rate_period_s));
  return v_limits;
end;
$$;

-- Gives a step back the limits its flow's spec sets (engine 0023): deletes an operator's override
-- (pgflow.set_step_limits) and applies the spec's limits (the steps' opt_max_in_flight,
-- opt_rate_limit, opt_rate_period; none when it sets none). Recorded as the operator action
-- 'reset_limits', with the override it removed. Without an override it changes nothing. Returns
-- the limits now; null when the step has none. Locks the step's row (as set_step_limits and a
-- flow's options do), so an override and the spec's limits never cross.
create function pgflow.reset_step_limits(flow_slug text, step_slug text)
returns pgflow.step_limits
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_step pgflow.steps;
  v_override pgflow.step_limit_overrides;
  v_limits pgflow.step_limits;
begin
  perform pgflow._require_step(flow_slug, step_slug);
  perform 1 from pgflow.steps as s
  where s.flow_slug = reset_step_limits.flow_slug and s.step_slug = reset_step_limits.step_slug
  for no key update;
  delete from pgflow.step_limit_overrides as o
  where o.flow_slug = reset_step_limits.flow_slug and o.step_slug = reset_step_limits.step_slug
  returning * into v_override;
  if v_override.flow_slug is not null then
    select * into v_step from pgflow.steps as s
    where s.flow_slug = reset_step_limits.flow_slug and s.step_slug = reset_step_limits.step_slug;
    perform pgflow._put_step_limits(flow_slug, step_slug, v_step.opt_max_in_flight,
      v_step.opt_rate_limit, v_step.opt_rate_period, 'spec');
  end if;
  select * into v_limits from pgflow.step_limits as l
  where l.flow_slug = reset_step_limits.flow_slug and l.step_slug = reset_step_limits.step_slug;
  perform pgflow._record_action('reset_limits', flow_slug, null, step_slug, jsonb_build_object(
    'removed', case when v_override.flow_slug is not null then jsonb_build_object(
      'max_in_flight', v_override.max_in_flight, 'rate_limit', v_override.rate_limit,
      'rate_period_s', v_override.rate_period_s) end));
  if v_limits.flow_slug is null then
    return null;
  end if;
  return v_limits;
end;
$$;

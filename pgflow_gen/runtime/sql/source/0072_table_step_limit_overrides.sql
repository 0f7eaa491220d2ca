-- An operator's limits for a step (engine 0023): they override the spec's (the steps'
-- opt_max_in_flight, opt_rate_limit, opt_rate_period) until an operator resets them.
-- pgflow.set_step_limits writes the row and pgflow.reset_step_limits deletes it; neither a
-- worker's start nor a flow's migration touches it, so an emergency throttle stays. All-null
-- limits are an override too (no limits while the spec sets some). actor is the login role that
-- set it, label what its caller said of itself (the setting pgflow.action_label). While the row
-- exists pgflow.step_limits holds its limits; gone with the step.
create table pgflow.step_limit_overrides (
  flow_slug text not null,
  step_slug text not null,
  max_in_flight int,
  rate_limit int,
  rate_period_s int,
  set_at timestamptz not null default now(),
  actor text not null default session_user,
  label text,
  primary key (flow_slug, step_slug),
  foreign key (flow_slug, step_slug) references pgflow.steps (flow_slug, step_slug) on delete cascade,
  constraint step_limit_overrides_are_whole check (
    coalesce(max_in_flight, 1) >= 1 and coalesce(rate_limit, 1) >= 1 and coalesce(rate_period_s, 1) >= 1
    and (rate_limit is null) = (rate_period_s is null)
  )
);

-- Flow control (engine 0017): a step's limits, enforced when tasks are claimed, across every
-- worker and every claim. max_in_flight caps the step's tasks started at once; rate_limit caps its
-- task starts in any rate_period_s seconds (each attempt of a task, and each element of a map,
-- is a start). A null limit is no limit; a step without a row has none. set_by says whose they
-- are: the flow's spec (the steps' opt_max_in_flight, opt_rate_limit and opt_rate_period, which a
-- worker's start or a generated migration keeps in step with the spec) or an operator
-- (pgflow.set_step_limits: since engine 0023 an override, pgflow.step_limit_overrides, kept until
-- pgflow.reset_step_limits). Claims lock the row, so the claims of a limited step take turns.
create table pgflow.step_limits (
  flow_slug text not null,
  step_slug text not null,
  max_in_flight int,
  rate_limit int,
  rate_period_s int,
  set_by text not null default 'operator',
  updated_at timestamptz not null default now(),
  primary key (flow_slug, step_slug),
  foreign key (flow_slug, step_slug) references pgflow.steps (flow_slug, step_slug) on delete cascade,
  constraint step_limits_positive check (
    coalesce(max_in_flight, 1) > 0 and coalesce(rate_limit, 1) > 0 and coalesce(rate_period_s, 1) > 0
  ),
  constraint step_limits_rate_has_period check ((rate_limit is null) = (rate_period_s is null)),
  constraint step_limits_some_limit check (max_in_flight is not null or rate_limit is not null),
  constraint step_limits_set_by check (set_by in ('spec', 'operator'))
);

-- The starts of a limited step's tasks (one row per claimed attempt): the ones whose task is
-- still started with that attempt are in flight; the ones within the rate period are the window.
-- Claims of the step delete the rows that are neither, so the table holds about max_in_flight +
-- rate_limit rows per limited step. Gone with the step's limits.
create table pgflow.step_slots (
  flow_slug text not null,
  step_slug text not null,
  run_id uuid not null,
  task_index int not null,
  attempt int not null,
  started_at timestamptz not null,
  primary key (flow_slug, step_slug, run_id, task_index, attempt),
  foreign key (flow_slug, step_slug) references pgflow.step_limits (flow_slug, step_slug)
    on delete cascade
);

create index step_slots_started_at_idx on pgflow.step_slots (flow_slug, step_slug, started_at);

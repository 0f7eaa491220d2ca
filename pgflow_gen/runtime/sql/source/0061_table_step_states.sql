-- One row per (run, step). remaining_deps counts unfinished dependencies; remaining_tasks counts
-- unfinished tasks once the step started; initial_tasks is null until a dependent map knows its size.
-- No index covers a column that changes, so state transitions are HOT updates.
create table pgflow.step_states (
  run_id uuid not null references pgflow.runs (run_id),
  flow_slug text not null,
  step_slug text not null,
  status pgflow.step_status not null default 'created',
  output jsonb,
  skip_reason pgflow.skip_reason,
  error_message text,
  remaining_tasks int,
  remaining_deps int not null default 0,
  initial_tasks int,
  created_at timestamptz not null default now(),
  started_at timestamptz,
  completed_at timestamptz,
  failed_at timestamptz,
  skipped_at timestamptz,
  primary key (run_id, step_slug),
  foreign key (flow_slug, step_slug) references pgflow.steps (flow_slug, step_slug),
  constraint remaining_deps_is_nonnegative check (remaining_deps >= 0),
  constraint remaining_tasks_is_nonnegative check (remaining_tasks is null or remaining_tasks >= 0),
  constraint output_is_only_on_completed check (output is null or status = 'completed'),
  constraint skip_reason_is_only_on_skipped check ((status = 'skipped') = (skip_reason is not null)),
  constraint initial_tasks_is_known_when_started check (status <> 'started' or initial_tasks is not null)
) with (fillfactor = 80);

create index step_states_flow_slug_idx on pgflow.step_states (flow_slug, step_slug);

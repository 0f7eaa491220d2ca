-- Step definitions in step_index order (the topological order); queue_name is the step's route.
-- Step slugs are unique ignoring case within a flow.
-- Written by add_step and ensure_flow_compiled under the flow's advisory lock; only the opt_*
-- columns and payload_schema are ever updated (ensure_flow_compiled applies a verified shape's
-- description). A signal step (engine 0011) runs no task: it waits for pgflow.send_signal, whose
-- payload payload_schema checks; its opt_timeout is how long it waits (null: for ever), and its
-- queue_name is reserved for it but no queue is created.
-- A subflow step (engine 0028) runs no task in a worker either: subflow_slug names the flow whose
-- run each of its tasks starts (step_type 'subflow': one child run; 'map': one per element), and
-- the child's completion completes the task. Its queue_name is reserved too, with no queue.
create table pgflow.steps (
  flow_slug text not null references pgflow.flows (flow_slug),
  step_slug text not null,
  step_index int not null,
  step_type text not null default 'single',
  deps_count int not null default 0,
  queue_name text not null,
  opt_max_attempts int,
  opt_base_delay int,
  opt_timeout int,
  opt_start_delay int,
  required_input_pattern jsonb,
  forbidden_input_pattern jsonb,
  when_unmet text not null default 'skip',
  when_exhausted text not null default 'fail',
  created_at timestamptz not null default now(),
  payload_schema jsonb,
  -- Fair concurrency per key (engine 0018; pgflow.concurrency_keys): a JSON path into the run's
  -- input whose value keys each task, and how many tasks of one key may hold a message at once.
  opt_concurrency_key text,
  opt_concurrency_limit int,
  -- The spec's limits of the step (engine 0023; null: none): what pgflow.step_limits holds unless
  -- an operator overrides them (pgflow.step_limit_overrides).
  opt_max_in_flight int,
  opt_rate_limit int,
  opt_rate_period int,
  subflow_slug text,
  primary key (flow_slug, step_slug),
  constraint steps_step_index_is_unique unique (flow_slug, step_index),
  constraint step_slug_is_valid check (pgflow.is_valid_slug(step_slug)),
  constraint step_index_is_nonnegative check (step_index >= 0),
  constraint step_type_is_known check (step_type in ('single', 'map', 'signal', 'subflow')),
  constraint deps_count_is_nonnegative check (deps_count >= 0),
  constraint map_step_has_at_most_one_dependency check (step_type <> 'map' or deps_count <= 1),
  constraint subflow_step_has_at_most_one_dependency check (step_type <> 'subflow' or deps_count <= 1),
  constraint subflow_slug_is_on_subflow_steps check (
    case step_type when 'subflow' then subflow_slug is not null when 'map' then true else subflow_slug is null end
  ),
  constraint queue_name_is_canonical check (
    length(queue_name) between 1 and 47 and queue_name = lower(queue_name)
  ),
  constraint opt_max_attempts_is_positive check (opt_max_attempts is null or opt_max_attempts >= 1),
  constraint opt_base_delay_is_nonnegative check (opt_base_delay is null or opt_base_delay >= 0),
  constraint opt_timeout_is_positive check (opt_timeout is null or opt_timeout >= 1),
  constraint opt_start_delay_is_nonnegative check (opt_start_delay is null or opt_start_delay >= 0),
  constraint required_input_pattern_is_object check (
    required_input_pattern is null or jsonb_typeof(required_input_pattern) = 'object'
  ),
  constraint forbidden_input_pattern_is_object check (
    forbidden_input_pattern is null or jsonb_typeof(forbidden_input_pattern) = 'object'
  ),
  constraint when_unmet_is_known check (when_unmet in ('fail', 'skip', 'skip-cascade')),
  constraint when_exhausted_is_known check (when_exhausted in ('fail', 'skip', 'skip-cascade')),
  constraint opt_concurrency_is_whole check (
    (opt_concurrency_key is null) = (opt_concurrency_limit is null) and coalesce(opt_concurrency_limit, 1) >= 1
  ),
  constraint payload_schema_is_a_signal_schema check (
    payload_schema is null or (step_type = 'signal' and jsonb_typeof(payload_schema) = 'object')
  ),
  constraint opt_limits_are_whole check (
    coalesce(opt_max_in_flight, 1) >= 1 and coalesce(opt_rate_limit, 1) >= 1
    and coalesce(opt_rate_period, 1) >= 1 and (opt_rate_limit is null) = (opt_rate_period is null)
  )
);

create unique index steps_flow_slug_lower_step_slug_idx on pgflow.steps (flow_slug, lower(step_slug));

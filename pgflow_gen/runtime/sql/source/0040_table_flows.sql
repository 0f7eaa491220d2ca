-- Flow definitions: one row per concrete flow slug, with the flow-wide option defaults.
-- queue_mode "flow" routes every step to its default queue (pgflow.default_queue_name); "step" gives every step a
-- private queue (see pgflow.derive_queue_routes). Slugs are unique ignoring case.
-- input_schema is the run input's JSON Schema as the flow's spec declares it (null: unknown),
-- stored by ensure_flow_compiled so that tools can check an input before starting a run.
-- Written by create_flow and ensure_flow_compiled under the flow's advisory lock.
create table pgflow.flows (
  flow_slug text primary key,
  opt_max_attempts int not null default 3,
  opt_base_delay int not null default 5,
  opt_timeout int not null default 60,
  created_at timestamptz not null default now(),
  queue_mode text not null default 'flow',
  input_schema jsonb,
  constraint flow_slug_is_valid check (pgflow.is_valid_slug(flow_slug)),
  constraint opt_max_attempts_is_positive check (opt_max_attempts >= 1),
  constraint opt_base_delay_is_nonnegative check (opt_base_delay >= 0),
  constraint opt_timeout_is_positive check (opt_timeout >= 1),
  constraint queue_mode_is_known check (queue_mode in ('flow', 'step')),
  constraint input_schema_is_an_object check (input_schema is null or jsonb_typeof(input_schema) = 'object')
);

create unique index flows_flow_slug_lower_idx on pgflow.flows (lower(flow_slug));

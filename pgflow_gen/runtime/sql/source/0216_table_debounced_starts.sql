-- Starts of a flow waiting out their debounce period (engine 0030): pgflow.debounce_start keeps
-- one row per (flow, debounce key) for a burst of starts, with the last start's input, and moves
-- start_at to period_s after the last start (never past deadline_at, max_wait_s after the
-- first). Workers' elected scheduler starts each row's run once start_at has passed
-- (pgflow.start_debounced_runs), deleting the row in the same transaction. Gone with the flow.
create table pgflow.debounced_starts (
  flow_slug text not null references pgflow.flows (flow_slug) on delete cascade,
  debounce_key text not null,
  input jsonb not null,
  -- How many starts the burst has collapsed so far, the first's and the last's time.
  starts int not null default 1,
  first_at timestamptz not null,
  last_at timestamptz not null,
  -- When the run starts; deadline_at (null: none) is the latest start_at may move to.
  start_at timestamptz not null,
  deadline_at timestamptz,
  primary key (flow_slug, debounce_key)
);
create index debounced_starts_start_at on pgflow.debounced_starts (start_at);

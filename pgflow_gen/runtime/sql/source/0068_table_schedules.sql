-- A flow's schedules (engine 0017), from its spec's `schedules`: a cron expression read in a
-- time zone, the run input, and what to do with slots missed while nothing ran them (catch_up:
-- none, latest or all). Workers start the runs (one elected per database; pgflow_gen.runtime's
-- scheduler computes the slots), each slot once: pgflow.start_scheduled_runs gives every run
-- the idempotency key "schedule:<name>:<slot>" and moves last_slot_at past it. A paused
-- schedule starts nothing; resuming it passes over the slots of the pause. Gone with the flow.
-- Its runs have its priority (engine 0031, 0 by default).
create table pgflow.schedules (
  flow_slug text not null references pgflow.flows (flow_slug) on delete cascade,
  schedule_name text not null,
  cron text not null,
  timezone text not null default 'UTC',
  input jsonb not null default '{}',
  catch_up text not null default 'none',
  paused_at timestamptz,
  -- The latest slot started or passed over (null: none yet; slots count from created_at).
  last_slot_at timestamptz,
  last_run_id uuid,
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now(),
  priority int not null default 0,
  primary key (flow_slug, schedule_name),
  constraint schedules_catch_up check (catch_up in ('none', 'latest', 'all')),
  constraint schedules_priority_is_in_range check (priority between 0 and 1000)
);

-- The signals runs have received (pgflow.send_signal), one per signal step of a run: a signal
-- sent before its step is ready waits here (used_at null) until the step becomes ready and takes
-- it as its output; one sent to a waiting step is used at once. The primary key refuses a second
-- signal for a step. Gone with the run's step states (pruning, deleting the flow).
create table pgflow.signals (
  run_id uuid not null,
  step_slug text not null,
  payload jsonb not null,
  received_at timestamptz not null default now(),
  used_at timestamptz,
  primary key (run_id, step_slug),
  foreign key (run_id, step_slug) references pgflow.step_states (run_id, step_slug) on delete cascade
);

-- One row per unit of work: one for a single step, one per element for a map step.
-- queue_name is the step's route copied once at creation; (queue_name, message_id) is unique
-- because PGMQ message ids are unique only within one queue. Few indexes on purpose: completing a
-- task should be a HOT update (no indexed column changes).
create table pgflow.step_tasks (
  run_id uuid not null,
  flow_slug text not null,
  step_slug text not null,
  task_index int not null default 0,
  status pgflow.task_status not null default 'queued',
  attempts_count int not null default 0,
  message_id bigint,
  queue_name text not null,
  output jsonb,
  error_message text,
  -- Informational; no foreign key, so pruning workers never rewrites task rows.
  last_worker_id uuid,
  requeued_count int not null default 0,
  last_requeued_at timestamptz,
  permanently_stalled_at timestamptz,
  queued_at timestamptz not null default now(),
  started_at timestamptz,
  completed_at timestamptz,
  failed_at timestamptz,
  -- The step's effective timeout when the current attempt was claimed: its lease (engine 0008),
  -- kept when the step's timeout changes meanwhile.
  claimed_timeout int,
  -- When the worker of the current attempt last said it still holds the task's result (engine
  -- 0008): a result it cannot send yet (a lock, a slow database) keeps its lease.
  lease_renewed_at timestamptz,
  -- The value of its step's concurrency key in the run's input (engine 0018), as text; null for
  -- a step without one. A keyed task without a message is parked (pgflow.parked_tasks).
  concurrency_key text,
  -- The attempts this task made before its run's last retry_run (engine 0020): attempts_count
  -- never goes back, so a result of an attempt before the retry is stale for ever, while the
  -- retry budget (max_attempts) and the retry delay count from here.
  attempts_before_retry int not null default 0,
  primary key (run_id, step_slug, task_index),
  foreign key (run_id, step_slug) references pgflow.step_states (run_id, step_slug),
  constraint output_is_only_on_finished check (output is null or status = 'completed' or status = 'failed')
) with (fillfactor = 80);

-- Unique per queue; message_id leads so that claims (message_id = any (...)) use it directly.
create unique index step_tasks_message_queue_idx on pgflow.step_tasks (message_id, queue_name);
-- The tasks completed lately (pgflow.finished_tasks, engine 0025): a BRIN index, which keeps the
-- completion's update HOT on PostgreSQL 16 and later, where a B-tree on a column the completion
-- sets would not. Tasks complete in about the order they were written, so its ranges are narrow.
create index step_tasks_completed_at_idx on pgflow.step_tasks using brin (completed_at)
  with (autosummarize = on);

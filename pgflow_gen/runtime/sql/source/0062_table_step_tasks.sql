-- One row per unit of work: one for a single step, one per element for a map step.
-- queue_name is the step's route copied once at creation; (queue_name, message_id) is unique
-- because PGMQ message ids are unique only within one queue.
create table pgflow.step_tasks (
  run_id uuid not null,
  flow_slug text not null,
  step_slug text not null,
  task_index int not null default 0,
  status text not null default 'queued',
  attempts_count int not null default 0,
  message_id bigint,
  queue_name text not null,
  output jsonb,
  error_message text,
  last_worker_id uuid references pgflow.workers (worker_id) on delete set null,
  requeued_count int not null default 0,
  last_requeued_at timestamptz,
  permanently_stalled_at timestamptz,
  queued_at timestamptz not null default now(),
  started_at timestamptz,
  completed_at timestamptz,
  failed_at timestamptz,
  primary key (run_id, step_slug, task_index),
  foreign key (run_id, step_slug) references pgflow.step_states (run_id, step_slug),
  constraint status_is_known check (
    status in ('queued', 'started', 'completed', 'failed', 'skipped', 'cancelled')
  ),
  constraint task_index_is_nonnegative check (task_index >= 0),
  constraint attempts_count_is_nonnegative check (attempts_count >= 0),
  constraint requeued_count_is_nonnegative check (requeued_count >= 0),
  constraint output_is_only_on_finished check (output is null or status in ('completed', 'failed')),
  constraint completed_at_is_after_queued_at check (completed_at is null or completed_at >= queued_at),
  constraint failed_at_is_after_queued_at check (failed_at is null or failed_at >= queued_at)
);

create unique index step_tasks_queue_message_idx on pgflow.step_tasks (queue_name, message_id)
  where message_id is not null;
create index step_tasks_started_idx on pgflow.step_tasks (started_at) where status = 'started';
create index step_tasks_active_idx on pgflow.step_tasks (run_id)
  where status in ('queued', 'started');
create index step_tasks_last_worker_idx on pgflow.step_tasks (last_worker_id)
  where status = 'started';

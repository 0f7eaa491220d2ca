-- One row per run of a flow. remaining_steps counts down as steps complete or are skipped.
-- A cancelled run (pgflow.cancel_run) keeps when and why in cancelled_at and cancel_reason.
-- idempotency_key names a run for its flow (pgflow.start_flow): a second start with the same key
-- returns this run. The key lives as long as the run (pruning frees it).
-- A failed run retried (pgflow.retry_run) is started again: retry_count counts the retries and
-- retried_at is when the last one was.
-- traceparent is the W3C trace context of the caller that started it (engine 0016), so that its
-- tasks' spans join the caller's trace (docs/observability.md); null when there was none.
-- A subflow run (engine 0028) names the task that started it: parent_run_id, parent_step_slug and
-- parent_task_index, all null for a top run. Its completion completes that task, in the same
-- transaction; its failure fails the task's attempt.
-- A forked run (engine 0029, pgflow.fork_run) names the run and the step it was forked from.
-- priority (engine 0031, 0 to 1000, 0 by default) orders the claims of its tasks: in a queue,
-- ready tasks of higher-priority runs are claimed first (pgflow.read_and_claim); subflow runs
-- take their parent's, forked runs their source's.
-- Locked (for update) by every transition of the run, which serialises them per run.
create table pgflow.runs (
  run_id uuid primary key default gen_random_uuid(),
  flow_slug text not null references pgflow.flows (flow_slug),
  status pgflow.run_status not null default 'started',
  input jsonb not null,
  output jsonb,
  remaining_steps int not null default 0,
  started_at timestamptz not null default now(),
  completed_at timestamptz,
  failed_at timestamptz,
  cancelled_at timestamptz,
  cancel_reason text,
  idempotency_key text,
  retry_count int not null default 0,
  retried_at timestamptz,
  traceparent text,
  parent_run_id uuid,
  parent_step_slug text,
  parent_task_index int,
  forked_from_run_id uuid,
  forked_from_step text,
  priority int not null default 0,
  constraint priority_is_in_range check (priority between 0 and 1000),
  constraint remaining_steps_is_nonnegative check (remaining_steps >= 0),
  constraint forked_from_is_whole check ((forked_from_run_id is null) = (forked_from_step is null)),
  constraint parent_is_whole check (
    (parent_run_id is null) = (parent_step_slug is null) and (parent_run_id is null) = (parent_task_index is null)
  )
) with (fillfactor = 80);

create index runs_flow_slug_idx on pgflow.runs (flow_slug);
create index runs_status_idx on pgflow.runs (status);
-- The newest runs first, page by page (the dashboard's runs list, keyset on start time and id).
create index runs_started_at_idx on pgflow.runs (started_at, run_id);
create unique index runs_idempotency_key_idx on pgflow.runs (flow_slug, idempotency_key)
  where idempotency_key is not null;
-- The children of a run, and of one of its tasks (a subflow step's).
create index runs_parent_idx on pgflow.runs (parent_run_id, parent_step_slug, parent_task_index)
  where parent_run_id is not null;
-- The started runs that claims put first, per flow (engine 0031): empty unless some run has a
-- priority, so a claim asks it for free.
create index runs_prioritised_idx on pgflow.runs (flow_slug, priority desc)
  where priority > 0 and status = 'started';

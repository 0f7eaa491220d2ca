-- Fair concurrency per key (engine 0018). A step with a concurrency key (steps.opt_concurrency_key,
-- a JSON path into the run's input, and opt_concurrency_limit) gives each of its tasks the key's
-- value (step_tasks.concurrency_key) and lets at most opt_concurrency_limit tasks of one key hold
-- a queue message at once (queued or started). The other tasks of that key wait parked, in
-- order, without a message: a key with a backlog of thousands puts no more than its limit in the
-- queue, so another key's task waits behind those, not behind the backlog.
--
-- concurrency_keys counts each key's admitted tasks (tasks with a message, not finished); a row
-- lives while the key has admitted or parked tasks. Only pgflow._balance_concurrency_keys writes
-- it, when a transaction that parked or finished keyed tasks commits, locking the keys it touches
-- in key order (so concurrent transactions cannot deadlock on them).
create table pgflow.concurrency_keys (
  flow_slug text not null,
  step_slug text not null,
  concurrency_key text not null,
  admitted int not null default 0,
  primary key (flow_slug, step_slug, concurrency_key),
  foreign key (flow_slug, step_slug) references pgflow.steps (flow_slug, step_slug) on delete cascade,
  constraint concurrency_keys_admitted_nonnegative check (admitted >= 0)
);

-- The tasks waiting for their key's room, oldest first (parked_seq). not_before is when the task
-- may start at the earliest (its step's start delay, counted from when it was queued). A row is
-- gone when the task gets its message, or when it finishes without one (cancelled, skipped).
create table pgflow.parked_tasks (
  flow_slug text not null,
  step_slug text not null,
  concurrency_key text not null,
  parked_seq bigint generated always as identity,
  run_id uuid not null,
  task_index int not null,
  not_before timestamptz not null,
  primary key (flow_slug, step_slug, concurrency_key, parked_seq),
  constraint parked_tasks_task_is_unique unique (run_id, step_slug, task_index),
  foreign key (run_id, step_slug, task_index) references pgflow.step_tasks (run_id, step_slug, task_index)
    on delete cascade
);

-- What a transaction did to keyed tasks, for pgflow._pass_concurrency_places to act on when a
-- completion ends and pgflow._balance_concurrency_keys when the transaction commits: released
-- counts admitted tasks of the key that finished, parked says tasks of the key were parked,
-- gone_run_id/gone_task_index name a parked task that finished. Rows never outlive their
-- transaction, and each names it (xact), so the functions read their own transaction's rows
-- through the index, never the dead rows of the transactions before.
create table pgflow.concurrency_events (
  xact xid8 not null default pg_current_xact_id(),
  flow_slug text not null,
  step_slug text not null,
  concurrency_key text not null,
  released int not null default 0,
  parked boolean not null default false,
  gone_run_id uuid,
  gone_task_index int
);

create index concurrency_events_xact_idx on pgflow.concurrency_events (xact);

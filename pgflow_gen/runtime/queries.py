"""Every statement the runtime sends, by name: the worker's (and the testing kit's, which runs
tasks as a worker does), the client's and the engine migrations'. Each is a string literal, so it
is a `LiteralString` that psycopg accepts as a query; parameters are always bound (`%s`), never
formatted in.

The engine's functions they call are documented in docs/engine.md.
"""

from __future__ import annotations

from typing import Final, LiteralString

# -- startup -------------------------------------------------------------------------------------
#: Compile a flow, or verify it matches: (slug, shape, queue mode, route map) -> status JSON.
ENSURE_FLOW_COMPILED: Final[LiteralString] = "select pgflow.ensure_flow_compiled(%s, %s, %s, %s)"
#: Whether this session's role may compile flows (engine 0019 grants it to admins only).
MAY_COMPILE: Final[LiteralString] = (
    "select has_function_privilege("
    "'pgflow.ensure_flow_compiled(text, jsonb, text, jsonb)', 'execute')"
)
#: Verify a flow matches, changing nothing (engine 0019): the same arguments and result as
#: ENSURE_FLOW_COMPILED, or status "missing".
VERIFY_FLOW_COMPILED: Final[LiteralString] = "select pgflow.verify_flow_compiled(%s, %s, %s, %s)"
#: (worker id, queue, name, flow slug, step slug or NULL).
REGISTER_WORKER: Final[LiteralString] = "select from pgflow.register_worker(%s, %s, %s, %s, %s)"
#: One worker at a time sets up insert notifications: (namespace, key).
LOCK_FOR_TRANSACTION: Final[LiteralString] = "select pg_advisory_xact_lock(%s, %s)"
#: The engine's worker liveness rule in seconds: heartbeat interval, live within, stalled after.
WORKER_LIVENESS: Final[LiteralString] = (
    "select extract(epoch from heartbeat_interval)::float8,"
    " extract(epoch from live_within)::float8, extract(epoch from stalled_after)::float8"
    " from pgflow.worker_liveness()"
)
#: One notification per inserting statement instead of PGMQ's per-row trigger: (queue).
ENABLE_STATEMENT_NOTIFICATIONS: Final[LiteralString] = (
    "select pgflow.enable_insert_notifications(%s)"
)

# -- polling -------------------------------------------------------------------------------------
#: Read up to n messages and claim their tasks in one call (engine 0012): (flow, queue, worker
#: id, n, seconds hidden, step or NULL) -> the claimed tasks.
READ_AND_CLAIM: Final[LiteralString] = "select * from pgflow.read_and_claim(%s, %s, %s, %s, %s, %s)"
#: Hide messages again, each for its own seconds: (queue, msg ids, seconds).
SET_VISIBILITY: Final[LiteralString] = (
    "select from pgflow.set_vt_batch(%s, %s::bigint[], %s::int[])"
)

# -- results -------------------------------------------------------------------------------------
#: (run id, step, task index, output, attempt) -> the task's (attempts_count, status).
COMPLETE_TASK: Final[LiteralString] = (
    "select attempts_count, status from pgflow.complete_task(%s, %s, %s, %s, %s)"
)
#: (run id, step, task index, error, attempt) -> the task's (attempts_count, status).
FAIL_TASK: Final[LiteralString] = (
    "select attempts_count, status from pgflow.fail_task(%s, %s, %s, %s, %s)"
)
#: (run id, step, task index, error, attempt, why it is not retried) -> the task's
#: (attempts_count, status): a permanent failure, never retried (engine 0011).
FAIL_TASK_PERMANENTLY: Final[LiteralString] = (
    "select attempts_count, status from pgflow.fail_task(%s, %s, %s, %s, %s, %s)"
)
#: Arrays of (run ids, steps, task indexes, outputs, attempts) -> a row per task, in order.
COMPLETE_TASKS: Final[LiteralString] = (
    "select attempts_count, status from pgflow.complete_tasks(%s, %s, %s, %s::jsonb[], %s::int[])"
)
#: Complete successes and claim the next tasks in one call (engine 0014): (flow, queue, worker
#: id, limit, visibility, step or NULL, run ids, step slugs, task indexes, outputs, attempts).
COMPLETE_AND_CLAIM: Final[LiteralString] = (
    "select * from pgflow.complete_and_claim(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb[],"
    " %s::int[])"
)

# -- upkeep --------------------------------------------------------------------------------------
#: (worker id) -> whether an operator deprecated the worker.
HEARTBEAT: Final[LiteralString] = "select pgflow.heartbeat_worker(%s)"
#: (run ids) -> each run's id and the trace context it was started in (engine 0019; workers
#: read no table).
TRACE_CONTEXTS: Final[LiteralString] = (
    "select run_id, traceparent from pgflow.run_trace_contexts(%s)"
)
#: (run ids) -> the ones the engine cancelled (engine 0020): a run:cancelled notification is
#: confirmed here before a worker stops the run's handlers.
CANCELLED_RUNS: Final[LiteralString] = "select c from pgflow.cancelled_runs(%s) as c"
#: (traceparent) -> this transaction's runs keep the caller's trace context (engine 0016).
SET_TRACEPARENT: Final[LiteralString] = "select set_config('pgflow.traceparent', %s, true)"
#: Bound the statements of this transaction: (statement timeout, lock timeout), as '5s'.
LIMIT_TRANSACTION: Final[LiteralString] = (
    "select set_config('statement_timeout', %s, true), set_config('lock_timeout', %s, true)"
)
#: Keep the leases of tasks whose results wait to be sent: (worker id, run ids, steps, task
#: indexes, attempts) -> how many were renewed.
RENEW_LEASES: Final[LiteralString] = (
    "select pgflow.renew_task_leases(%s, %s::uuid[], %s::text[], %s::int[], %s::int[])"
)
#: Requeue stalled tasks when no other worker is doing it: (namespace, key) -> count or NULL.
REQUEUE_STALLED: Final[LiteralString] = (
    "select case when pg_try_advisory_xact_lock(%s, %s) then pgflow.requeue_stalled_tasks() end"
)
#: (worker id).
MARK_STOPPED: Final[LiteralString] = "select pgflow.mark_worker_stopped(%s)"
#: A quiet listener checks that its session is alive.
PING: Final[LiteralString] = "select 1"

# -- handlers ------------------------------------------------------------------------------------
#: (run id) -> the run input, for `ctx.flow_input()` of tasks that do not carry it (engine 0019;
#: a step's own role reads only runs with a task of its step).
RUN_INPUT: Final[LiteralString] = "select pgflow.run_input(%s)"
#: (run id) -> the run's status (the testing kit's loop).
RUN_STATUS: Final[LiteralString] = "select status from pgflow.runs where run_id = %s"
#: (run id) -> each step's (slug, status, remaining tasks), for the testing kit's messages.
STEP_STATES: Final[LiteralString] = (
    "select step_slug, status, remaining_tasks from pgflow.step_states"
    " where run_id = %s order by step_slug"
)
#: Make a run's waiting messages (a retry's backoff, a start delay) visible now, in the queue
#: table `{}` (an identifier composed in): (run id). The testing kit's "no backoff sleep".
SHOW_WAITING_MESSAGES: Final[LiteralString] = (
    "update pgmq.{} set vt = clock_timestamp()"
    " where vt > clock_timestamp() and message->>'run_id' = %s"
)

# -- client --------------------------------------------------------------------------------------
#: (flow, inputs, idempotency keys or NULL) -> the runs, in input order, as `Run` takes them
#: (engine 0014).
START_FLOWS: Final[LiteralString] = (
    "select run_id, flow_slug, status, input, output, started_at, completed_at, failed_at,"
    " cancelled_at, cancel_reason, idempotency_key, retry_count, retried_at"
    " from pgflow.start_flows(%s, %s::jsonb[], %s::text[])"
)
#: (run id) -> the run's row, as `Run` takes it.
READ_RUN: Final[LiteralString] = (
    "select run_id, flow_slug, status, input, output, started_at, completed_at, failed_at,"
    " cancelled_at, cancel_reason, idempotency_key, retry_count, retried_at"
    " from pgflow.runs where run_id = %s"
)
#: (run id, step, payload) -> the signal as received (`SentSignal`; engine 0011).
SEND_SIGNAL: Final[LiteralString] = (
    "select run_id, step_slug, payload, received_at, used_at from pgflow.send_signal(%s, %s, %s)"
)
#: (run id) -> its signal steps that wait for their signal now (`WaitingSignal`), in step order.
WAITING_SIGNALS: Final[LiteralString] = (
    "select ss.step_slug, ss.started_at as waiting_since,"
    " ss.started_at + make_interval(secs => s.opt_timeout) as deadline"
    " from pgflow.step_states as ss"
    " join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug"
    " where ss.run_id = %s and s.step_type = 'signal' and ss.status = 'started'"
    " order by s.step_index"
)
#: (flow, step, reason) -> the step's pause (engine 0010).
PAUSE_STEP: Final[LiteralString] = (
    "select flow_slug, step_slug, reason, paused_at from pgflow.pause_step(%s, %s, %s)"
)
#: (flow, step) -> how many held messages were shown again (engine 0010).
RESUME_STEP: Final[LiteralString] = "select pgflow.resume_step(%s, %s)"
#: (run id, reason) -> the run cancelled (engine 0010).
CANCEL_RUN: Final[LiteralString] = "select run_id from pgflow.cancel_run(%s, %s)"
#: (run id) -> its first failed step, with its failed task's attempts and error (`StepFailure`).
READ_FAILURE: Final[LiteralString] = (
    "select ss.step_slug, t.task_index, coalesce(t.attempts_count, 0) as attempts,"
    " coalesce(t.error_message, ss.error_message) as error"
    " from pgflow.step_states as ss"
    " left join lateral ("
    "   select * from pgflow.step_tasks as t"
    "   where t.run_id = ss.run_id and t.step_slug = ss.step_slug and t.status = 'failed'"
    "   order by t.failed_at, t.task_index limit 1"
    " ) as t on true"
    " where ss.run_id = %s and ss.status = 'failed'"
    " order by ss.failed_at limit 1"
)
#: (freshness seconds or NULL for the liveness rule, run id) -> the steps of the run with queued
#: tasks and no live worker (`UnservedStep`).
UNSERVED_STEPS: Final[LiteralString] = (
    "select t.step_slug, t.queue_name, count(*)::int as queued_tasks"
    " from pgflow.step_tasks as t"
    " join pgflow.queue_coverage(coalesce(make_interval(secs => %s),"
    "   (pgflow.worker_liveness()).live_within)) as c"
    "   on c.flow_slug = t.flow_slug and c.step_slug = t.step_slug"
    " where t.run_id = %s and t.status = 'queued' and not c.covered"
    " group by t.step_slug, t.queue_name, c.step_index order by c.step_index"
)

# -- engine migrations ---------------------------------------------------------------------------
#: Whether PGMQ is there, as SQL or as an extension.
HAS_PGMQ: Final[LiteralString] = (
    "select exists (select 1 from pg_namespace where nspname = 'pgmq')"
    " or exists (select 1 from pg_extension where extname = 'pgmq')"
)
#: Whether any engine migration was applied.
HAS_MIGRATIONS: Final[LiteralString] = "select to_regclass('pgflow.schema_migrations') is not null"
#: The applied engine migrations: (version, checksum) rows.
APPLIED_MIGRATIONS: Final[LiteralString] = "select version, checksum from pgflow.schema_migrations"
#: The same as a line of the engine script for other migration tools: literals composed in.
RECORD_MIGRATION_SCRIPT: Final[LiteralString] = (
    "insert into pgflow.schema_migrations (version, name, checksum) values ({}, {}, {});"
)
#: One migrator at a time, for the whole session: (namespace, key).
LOCK_FOR_SESSION: Final[LiteralString] = "select pg_advisory_lock(%s, %s)"
#: (namespace, key).
UNLOCK_FOR_SESSION: Final[LiteralString] = "select pg_advisory_unlock(%s, %s)"
#: (version, name, checksum).
RECORD_MIGRATION: Final[LiteralString] = (
    "insert into pgflow.schema_migrations (version, name, checksum) values (%s, %s, %s)"
)

#: What every named statement is: a literal string, so psycopg takes it as a query.
Query = LiteralString

"""Every statement a worker sends, by name: starting up, claiming, reporting results, keeping
its leases and registration, its scheduler, and what its handlers read (the testing kit runs
tasks as a worker does and sends these too). Each is a string literal, so it is a
`LiteralString` that psycopg accepts as a query; parameters are always bound (`%s`), never
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
#: Make runs' waiting messages (a retry's backoff, a start delay) visible now, in the queue
#: table `{}` (an identifier composed in): (run ids, as text). The testing kit's "no backoff
#: sleep".
SHOW_WAITING_MESSAGES: Final[LiteralString] = (
    "update pgmq.{} set vt = clock_timestamp()"
    " where vt > clock_timestamp() and message->>'run_id' = any(%s)"
)
#: (run id) -> the run's id and its subflow runs' ids, however deep (engine 0028).
RUN_TREE: Final[LiteralString] = (
    "with recursive tree (run_id) as ("
    "   select %s::uuid"
    "   union all"
    "   select c.run_id from tree as t join pgflow.runs as c on c.parent_run_id = t.run_id"
    " ) select run_id from tree"
)

# -- schedules -----------------------------------------------------------------------------------
#: One scheduler at a time per database: (namespace, key) -> whether this one was elected.
ELECT_SCHEDULER: Final[LiteralString] = "select pg_try_advisory_xact_lock(%s, %s) as elected"
#: () -> the debounced bursts that were due, each started: (flow, key, starts, run id) (0030).
START_DEBOUNCED_RUNS: Final[LiteralString] = (
    "select flow_slug, debounce_key, starts, run_id from pgflow.start_debounced_runs()"
)
#: () -> seconds until the earliest pending debounced start is due (NULL: none; engine 0030).
DEBOUNCED_STARTS_DUE_IN: Final[LiteralString] = "select pgflow.debounced_starts_due_in()"
#: The schedules as the engine lists them to workers (engine 0019: workers read no table).
LIST_SCHEDULES: Final[LiteralString] = (
    "select flow_slug, name, cron, timezone, catch_up, last_slot_at, created_at, paused"
    " from pgflow.list_schedules()"
)
#: (flow, schedule, slots up to, at most) -> the slots started: (slot, run id, created).
START_SCHEDULED_RUNS: Final[LiteralString] = (
    "select slot, run_id, created from pgflow.start_scheduled_runs(%s, %s, %s, %s)"
)

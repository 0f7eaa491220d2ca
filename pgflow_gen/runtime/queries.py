"""Every statement a worker (and the testing kit, which runs tasks as a worker does) sends, by
name. Each is a string literal, so it is a `LiteralString` that psycopg accepts as a query;
parameters are always bound (`%s`), never formatted in.

The engine's functions they call are documented in docs/engine.md.
"""

from __future__ import annotations

from typing import Final, LiteralString

# -- startup -------------------------------------------------------------------------------------
#: The OID of a function (NULL when it does not exist): is the engine new enough?
FUNCTION_EXISTS: Final[LiteralString] = "select to_regprocedure(%s)"
#: Compile a flow, or verify it matches: (slug, shape, queue mode, route map) -> status JSON.
ENSURE_FLOW_COMPILED: Final[LiteralString] = "select pgflow.ensure_flow_compiled(%s, %s, %s, %s)"
#: (worker id, queue, name, flow slug, step slug or NULL).
REGISTER_WORKER: Final[LiteralString] = "select from pgflow.register_worker(%s, %s, %s, %s, %s)"
#: One worker at a time sets up insert notifications: (namespace, key).
LOCK_FOR_TRANSACTION: Final[LiteralString] = "select pg_advisory_xact_lock(%s, %s)"
#: Whether this PGMQ has insert notifications at all.
PGMQ_HAS_NOTIFICATIONS: Final[LiteralString] = (
    "select to_regclass('pgmq.notify_insert_throttle') is not null"
)
#: Whether a queue's inserts already notify: (queue).
QUEUE_NOTIFIES: Final[LiteralString] = (
    "select exists (select 1 from pgmq.notify_insert_throttle where queue_name = %s)"
)
#: The engine's worker liveness rule in seconds: heartbeat interval, live within, stalled after.
WORKER_LIVENESS: Final[LiteralString] = (
    "select extract(epoch from heartbeat_interval)::float8,"
    " extract(epoch from live_within)::float8, extract(epoch from stalled_after)::float8"
    " from pgflow.worker_liveness()"
)
#: Make a queue's inserts notify, unthrottled: (queue).
ENABLE_NOTIFICATIONS: Final[LiteralString] = "select pgmq.enable_notify_insert(%s, 0)"

# -- polling -------------------------------------------------------------------------------------
#: Read up to n visible messages and hide them for a while: (queue, seconds, n).
READ_MESSAGES: Final[LiteralString] = "select msg_id from pgmq.read(%s, %s, %s)"
#: Claim the queued tasks of messages read, flow mode: (flow, msg ids, worker id, queue).
CLAIM_TASKS: Final[LiteralString] = "select * from pgflow.claim_tasks(%s, %s, %s, %s)"
#: The same for one step of a step-queued flow: (flow, msg ids, worker id, queue, step).
CLAIM_STEP_TASKS: Final[LiteralString] = "select * from pgflow.claim_tasks(%s, %s, %s, %s, %s)"
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
#: Arrays of (run ids, steps, task indexes, outputs, attempts) -> a row per task, in order.
COMPLETE_TASKS: Final[LiteralString] = (
    "select attempts_count, status from pgflow.complete_tasks(%s, %s, %s, %s::jsonb[], %s::int[])"
)

# -- upkeep --------------------------------------------------------------------------------------
#: (worker id) -> whether an operator deprecated the worker.
HEARTBEAT: Final[LiteralString] = "select pgflow.heartbeat_worker(%s)"
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
#: (run id) -> the run input, for `ctx.flow_input()` of tasks that do not carry it.
RUN_INPUT: Final[LiteralString] = "select input from pgflow.runs where run_id = %s"
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

#: What every named statement is: a literal string, so psycopg takes it as a query.
Query = LiteralString

"""Every statement the client sends, by name: starting runs, reading them, and the operator's
actions (cancel, retry, signal, pause and resume, limits, schedules), which the CLI and the
dashboard perform through the same `runtime/client/operations`. Literal strings with bound
parameters, as everywhere in the gateway.
"""

from __future__ import annotations

from typing import Final, LiteralString

# -- client --------------------------------------------------------------------------------------
#: (flow, input, run id or NULL) -> the new (or, for a known run id, the existing) run's id and
#: status.
START_FLOW: Final[LiteralString] = "select run_id, status from pgflow.start_flow(%s, %s, %s)"
#: (flow, input, run id, idempotency key) -> the id and status of the new run, or of the run
#: with that key (engine 0010).
START_FLOW_WITH_KEY: Final[LiteralString] = (
    "select run_id, status from pgflow.start_flow(%s, %s, %s, idempotency_key => %s)"
)
#: (flow, input, run id, idempotency key or NULL, priority) -> as START_FLOW_WITH_KEY, for a run
#: with a priority above 0 (engine 0031; a run of priority 0 uses the statements above, which
#: every engine has).
START_FLOW_WITH_PRIORITY: Final[LiteralString] = (
    "select run_id, status"
    " from pgflow.start_flow(%s, %s, %s, idempotency_key => %s, priority => %s)"
)
#: (flow, inputs, idempotency keys or NULL) -> the runs, in input order, every column the
#: engine's runs have (engine 0014; `run_calls` keeps those `Run` takes).
START_FLOWS: Final[LiteralString] = "select * from pgflow.start_flows(%s, %s::jsonb[], %s::text[])"
#: (flow, inputs, idempotency keys or NULL, priority) -> as START_FLOWS, every new run with the
#: priority (engine 0031).
START_FLOWS_WITH_PRIORITY: Final[LiteralString] = (
    "select * from pgflow.start_flows(%s, %s::jsonb[], %s::text[], priority => %s)"
)
#: (flow, input, key, period s, max wait s or NULL) -> the pending start of the key's burst, as
#: `PendingStart` takes it (engine 0030).
DEBOUNCE_START: Final[LiteralString] = (
    "select flow_slug, debounce_key, input, starts, first_at, last_at, start_at, deadline_at"
    " from pgflow.debounce_start(%s, %s, %s, %s::numeric, %s::numeric)"
)
#: (flow or NULL: every flow) -> the pending debounced starts, the soonest first (engine 0030).
PENDING_STARTS: Final[LiteralString] = (
    "select flow_slug, debounce_key, input, starts, first_at, last_at, start_at, deadline_at"
    " from pgflow.debounced_starts where %s::text is null or flow_slug = %s::text"
    " order by start_at, flow_slug, debounce_key"
)
#: (run id) -> the run's row, every column the engine's runs have (so a newer engine's, such as
#: priority since 0031, show on `Run` without a version probe; `run_calls` keeps those it takes).
READ_RUN: Final[LiteralString] = "select * from pgflow.runs where run_id = %s"
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

# -- operator actions (`runtime/client/operations`) --------------------------------------------
#: (run id) -> the run as retrying it left it (engine 0011): read in the same statement, since
#: its workers may change it the moment it commits.
RETRY_RUN: Final[LiteralString] = (
    "select run_id, flow_slug, status, retry_count from pgflow.retry_run(%s)"
)
#: (run id, step slug) -> the new run forked from the run at that step (engine 0029), read in the
#: same statement.
FORK_RUN: Final[LiteralString] = (
    "select run_id, flow_slug, status, forked_from_run_id, forked_from_step"
    " from pgflow.fork_run(%s, %s)"
)
#: (label) -> the engine records this transaction's operator actions with the caller's label
#: (the CLI's `pgflow-gen (user@host)`, the dashboard's client address) beside the login role
#: (engine 0020; what the caller says of itself, not vouched for).
SET_ACTION_LABEL: Final[LiteralString] = "select set_config('pgflow.action_label', %s, true)"
#: (flow, step, max in flight, rate limit, rate period) -> the step's limits afterwards (all
#: NULL when cleared; engine 0017).
SET_STEP_LIMITS: Final[LiteralString] = (
    "select max_in_flight, rate_limit, rate_period_s, set_by"
    " from pgflow.set_step_limits(%s, %s, %s, %s, %s)"
)
#: (flow, step) -> the step's limits after the operator's override is gone: the spec's (all
#: NULL when it sets none; engine 0023).
RESET_STEP_LIMITS: Final[LiteralString] = (
    "select max_in_flight, rate_limit, rate_period_s, set_by from pgflow.reset_step_limits(%s, %s)"
)
#: (flow, name) -> the schedule paused (engine 0017).
PAUSE_SCHEDULE: Final[LiteralString] = "select * from pgflow.pause_schedule(%s, %s)"
#: (flow, name) -> the schedule resumed: the slots of its pause passed over (engine 0017).
RESUME_SCHEDULE: Final[LiteralString] = "select * from pgflow.resume_schedule(%s, %s)"

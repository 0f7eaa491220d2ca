"""Every statement the command line sends, by name: what `pgflow-gen` reads for people (runs,
a run's steps, flows, workers, coverage) and the checks of `db` and `start`. Each is a string
literal (a `LiteralString` psycopg accepts as a query); parameters are always bound.

The engine's functions and tables they read are documented in docs/engine.md.
"""

from __future__ import annotations

from typing import Final, LiteralString

from pgflow_gen.engine import statements

# -- db ------------------------------------------------------------------------------------------
SERVER_VERSION: Final[LiteralString] = "show server_version"
#: How PGMQ is installed here: 'extension <version>', its SQL install's comment, or NULL.
PGMQ_VERSION: Final[LiteralString] = (
    "select coalesce("
    " (select 'extension ' || extversion from pg_extension where extname = 'pgmq'),"
    " (select obj_description(oid, 'pg_namespace') from pg_namespace where nspname = 'pgmq'),"
    " (select 'SQL install' from pg_namespace where nspname = 'pgmq'))"
)

# -- flows and runs ------------------------------------------------------------------------------
#: (flow slug, inputs, keys or NULL) -> each run's id and status, and whether this call started
#: it (a run with the key already was started by an earlier transaction; engine 0014).
START_FLOWS_CREATED: Final[LiteralString] = (
    "select r.run_id, r.status, r.started_at = now() as created"
    " from pgflow.start_flows(%s, %s::jsonb[], %s::text[]) as r"
)
#: (flow slug, inputs, keys or NULL, priority) -> as START_FLOWS_CREATED, every new run with the
#: priority (engine 0031).
START_FLOWS_CREATED_WITH_PRIORITY: Final[LiteralString] = (
    "select r.run_id, r.status, r.started_at = now() as created"
    " from pgflow.start_flows(%s, %s::jsonb[], %s::text[], priority => %s) as r"
)
#: (run id) -> the run's row.
RUN_ROW: Final[LiteralString] = "select * from pgflow.runs where run_id = %s"
#: (low, high) -> up to 11 runs whose ids lie between (those that start with a prefix), newest
#: first: one is the run meant, more are the candidates to name.
RUNS_IN_ID_RANGE: Final[LiteralString] = (
    "select run_id, flow_slug, status, started_at from pgflow.runs"
    " where run_id between %s and %s order by started_at desc limit 11"
)


def run_step_status(version: str) -> LiteralString:
    """(run id) -> each step in step order: state, queue, tasks, most attempts, a note, and the
    latest error of its tasks (the failed one, else the last retried one) with its attempt; a
    signal step's type, and when it waits: since when and until when (NULL: for ever); a
    subflow step's flow (engine 0028; null on an engine of the window before it)."""
    return (
        _RUN_STEP_STATUS_HEAD
        + (" s.subflow_slug," if version >= "0028" else " null::text as subflow_slug,")
        + _RUN_STEP_STATUS_REST
    )


_RUN_STEP_STATUS_HEAD: Final[LiteralString] = (
    "select ss.step_slug, ss.status, s.queue_name, ss.initial_tasks, s.step_type,"
)
_RUN_STEP_STATUS_REST: Final[LiteralString] = (
    # A signal step waits while its run is started: a failed or cancelled run waits for nothing.
    " case when s.step_type = 'signal' and ss.status = 'started' and r.status = 'started'"
    "   then ss.started_at end as waiting_since,"
    " case when s.step_type = 'signal' and ss.status = 'started' and r.status = 'started'"
    "   then ss.started_at + make_interval(secs => s.opt_timeout) end as waiting_until,"
    # A completed step's note is not an error it recovered from (the last errors show that).
    " coalesce(ss.error_message, ss.skip_reason,"
    "   case when ss.status <> 'completed' then e.error_message end) as note,"
    " a.attempts, e.task_index, e.error_attempt, e.status as task_status, e.error_message"
    " from pgflow.step_states as ss"
    " join pgflow.runs as r on r.run_id = ss.run_id"
    " join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug"
    " left join lateral ("
    "   select max(t.attempts_count) as attempts from pgflow.step_tasks as t"
    "   where t.run_id = ss.run_id and t.step_slug = ss.step_slug"
    " ) as a on true"
    " left join lateral ("
    # The attempt the error came from: a started or completed task ran again after it.
    "   select t.task_index, t.status, t.error_message, t.attempts_count"
    "     - case when t.status in ('started', 'completed') then 1 else 0 end as error_attempt"
    "   from pgflow.step_tasks as t"
    "   where t.run_id = ss.run_id and t.step_slug = ss.step_slug"
    "     and t.error_message is not null"
    "   order by t.status = 'failed' desc,"
    "     coalesce(t.failed_at, t.completed_at, t.started_at, t.queued_at) desc"
    "   limit 1"
    " ) as e on true"
    " where ss.run_id = %s order by s.step_index"
)


def runs(version: str) -> LiteralString:
    """({flow, status, parent, limit}; NULL flow, status or parent: any) -> the newest runs,
    each with its first failed step and that step's error, and its parent run (engine 0028; on
    an engine of the window before it, none, and a parent selects nothing)."""
    if statements.has_subflows(version):
        return _RUNS_HEAD + " r.parent_run_id," + _RUNS_REST + _RUNS_BY_PARENT + _RUNS_TAIL
    return _RUNS_HEAD + " null::uuid as parent_run_id," + _RUNS_REST + _NO_PARENT + _RUNS_TAIL


_RUNS_HEAD: Final[LiteralString] = "select r.run_id, r.flow_slug, r.status, r.started_at,"
_RUNS_REST: Final[LiteralString] = (
    " coalesce(r.completed_at, r.failed_at, r.cancelled_at) as ended,"
    " f.step_slug as failed_step, f.error_message, r.cancel_reason,"
    " coalesce(w.slugs, '{}') as waiting_signals"
    " from pgflow.runs as r"
    " left join lateral ("
    "   select ss.step_slug, ss.error_message from pgflow.step_states as ss"
    "   where ss.run_id = r.run_id and ss.status = 'failed'"
    "   order by ss.failed_at limit 1"
    " ) as f on true"
    " left join lateral ("
    "   select array_agg(ss.step_slug order by ss.step_slug) as slugs"
    "   from pgflow.step_states as ss join pgflow.steps as s"
    "     on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug"
    "   where r.status = 'started' and ss.run_id = r.run_id"
    "     and s.step_type = 'signal' and ss.status = 'started'"
    " ) as w on true"
    " where (%(flow)s::text is null or r.flow_slug = %(flow)s)"
    "   and (%(status)s::text is null or r.status = %(status)s)"
)
_RUNS_BY_PARENT: Final[LiteralString] = (
    "   and (%(parent)s::uuid is null or r.parent_run_id = %(parent)s)"
)
_NO_PARENT: Final[LiteralString] = "   and %(parent)s::uuid is null"
_RUNS_TAIL: Final[LiteralString] = " order by r.started_at desc limit %(limit)s"
#: ({flow, age}) -> the flow's started runs, oldest first; with an age, only those older.
STARTED_RUNS_OF_FLOW: Final[LiteralString] = (
    "select run_id, flow_slug, status, started_at from pgflow.runs"
    " where flow_slug = %(flow)s and status = 'started'"
    "   and (%(age)s::interval is null or started_at < now() - %(age)s::interval)"
    " order by started_at, run_id"
)


def prunable_runs(version: str) -> LiteralString:
    """({age}) -> how many finished runs prune_data_older_than would delete, in all and by
    status (top runs: a subflow run goes with its top run, engine 0028), and their subflow
    runs."""
    return _PRUNABLE_RUNS if statements.has_subflows(version) else _PRUNABLE_RUNS_BEFORE_0028


_PRUNABLE_RUNS: Final[LiteralString] = (
    "with recursive top as ("
    "   select run_id, status from pgflow.runs"
    "   where coalesce(completed_at, failed_at, cancelled_at) < now() - %(age)s::interval"
    "     and status in ('completed', 'failed', 'cancelled') and parent_run_id is null"
    " ), below (run_id) as ("
    "   select c.run_id from top as t join pgflow.runs as c on c.parent_run_id = t.run_id"
    "   union all"
    "   select c.run_id from below as b join pgflow.runs as c on c.parent_run_id = b.run_id"
    " )"
    " select count(*) as runs,"
    " count(*) filter (where status = 'completed') as completed,"
    " count(*) filter (where status = 'failed') as failed,"
    " count(*) filter (where status = 'cancelled') as cancelled,"
    " (select count(*) from below) as subflow_runs"
    " from top"
)
#: _PRUNABLE_RUNS on engines 0020 to 0027 (no subflow runs). It goes when the window passes 0027.
_PRUNABLE_RUNS_BEFORE_0028: Final[LiteralString] = (
    "select count(*) as runs,"
    " count(*) filter (where status = 'completed') as completed,"
    " count(*) filter (where status = 'failed') as failed,"
    " count(*) filter (where status = 'cancelled') as cancelled,"
    " 0::bigint as subflow_runs"
    " from pgflow.runs"
    " where coalesce(completed_at, failed_at, cancelled_at) < now() - %(age)s::interval"
    "   and status in ('completed', 'failed', 'cancelled')"
)


def prunable_by_flow(version: str) -> LiteralString:
    """({age}) -> the finished top runs a prune with that age would delete, by flow and
    status."""
    top: LiteralString = " and parent_run_id is null" if statements.has_subflows(version) else ""
    return (
        "select flow_slug, status, count(*)::int as runs from pgflow.runs"
        " where coalesce(completed_at, failed_at, cancelled_at) < now() - %(age)s::interval"
        "   and status in ('completed', 'failed', 'cancelled')"
        + top
        + " group by flow_slug, status order by flow_slug, status"
    )


#: (retention, batch size) -> what one bounded prune deleted, and whether it is done (0015).
PRUNE: Final[LiteralString] = "select pgflow.prune_data_older_than(%s, %s) as pruned"
#: ({flow, age}) -> the failed runs of the flow (that failed within `age`), oldest first.
FAILED_RUNS_OF_FLOW: Final[LiteralString] = (
    "select run_id, flow_slug, status, failed_at from pgflow.runs"
    " where flow_slug = %(flow)s and status = 'failed'"
    "   and (%(age)s::interval is null or failed_at > now() - %(age)s::interval)"
    " order by failed_at, run_id"
)
#: ({ids, age}) -> those runs, each saying whether it started less than `age` ago (`young`).
RUNS_BY_ID: Final[LiteralString] = (
    "select run_id, flow_slug, status, started_at,"
    " coalesce(started_at > now() - %(age)s::interval, false) as young"
    " from pgflow.runs where run_id = any(%(ids)s)"
)


def flow_steps(version: str) -> LiteralString:
    """({flow}; NULL: every flow) -> each step of each flow with its own and its flow's
    options, and a subflow step's flow (engine 0028; null before)."""
    subflow: LiteralString = (
        " s.subflow_slug," if statements.has_subflows(version) else " null::text as subflow_slug,"
    )
    return _FLOW_STEPS_HEAD + subflow + _FLOW_STEPS_REST


_FLOW_STEPS_HEAD: Final[LiteralString] = (
    "select f.flow_slug, f.queue_mode, s.step_slug, s.step_type, s.queue_name,"
)
_FLOW_STEPS_REST: Final[LiteralString] = (
    " s.opt_max_attempts, s.opt_base_delay, s.opt_timeout, s.opt_start_delay,"
    " f.opt_max_attempts as flow_max_attempts, f.opt_base_delay as flow_base_delay,"
    " f.opt_timeout as flow_timeout"
    " from pgflow.flows as f join pgflow.steps as s using (flow_slug)"
    " where %(flow)s::text is null or f.flow_slug = %(flow)s"
    " order by f.flow_slug, s.step_index"
)

#: ({flow}; NULL: every flow) -> each table trigger (engine 0032) of each flow, in name order.
FLOW_TRIGGERS: Final[LiteralString] = (
    "select flow_slug, trigger_name, table_name, definition, condition, on_error, applied_at"
    " from pgflow.flow_triggers where %(flow)s::text is null or flow_slug = %(flow)s"
    " order by flow_slug, trigger_name"
)
#: ({flow}, {limit}) -> the latest starts table triggers skipped (engine 0032), latest first.
TRIGGER_SKIPS: Final[LiteralString] = (
    "select skip_id, skipped_at, flow_slug, trigger_name, table_name, operation, input, sqlstate,"
    " message from pgflow.trigger_skips where %(flow)s::text is null or flow_slug = %(flow)s"
    " order by skipped_at desc, skip_id desc limit %(limit)s"
)

# -- workers -------------------------------------------------------------------------------------
#: (flow slug or NULL, twice) -> every schedule (of that flow) with its last run's status.
SCHEDULES: Final[LiteralString] = (
    "select s.flow_slug, s.schedule_name, s.cron, s.timezone, s.catch_up, s.input, s.paused_at,"
    " s.last_slot_at, s.last_run_id, r.status as last_run_status"
    " from pgflow.schedules as s left join pgflow.runs as r on r.run_id = s.last_run_id"
    " where %s::text is null or s.flow_slug = %s order by s.flow_slug, s.schedule_name"
)
#: (flow slug) -> its schedules' names.
SCHEDULE_NAMES: Final[LiteralString] = (
    "select schedule_name from pgflow.schedules where flow_slug = %s order by schedule_name"
)
#: () -> every paused step with its reason and since when.
STEP_PAUSES: Final[LiteralString] = (
    "select flow_slug, step_slug, reason, paused_at from pgflow.step_pauses"
    " order by flow_slug, step_slug"
)
#: (flow slug) -> its step slugs in step order.
STEP_SLUGS: Final[LiteralString] = (
    "select step_slug from pgflow.steps where flow_slug = %s order by step_index"
)
#: (seconds or NULL) -> those seconds, else the liveness rule's "live within" ("seconds").
FRESHNESS: Final[LiteralString] = (
    "select extract(epoch from coalesce(make_interval(secs => %s),"
    " (pgflow.worker_liveness()).live_within))::float8 as seconds"
)
#: (freshness seconds, flow slug or NULL, the same) -> every route with its live workers.
QUEUE_COVERAGE: Final[LiteralString] = (
    "select * from pgflow.queue_coverage(make_interval(secs => %s))"
    " where %s::text is null or flow_slug = %s"
)

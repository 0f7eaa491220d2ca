"""The statements more than one part of pgflow-gen sends (the client, the CLI, the dashboard):
each defined once, named and `LiteralString`, and the LISTEN and UNLISTEN of a channel. The
statements one part sends live beside these: `worker_statements`, `client_statements`,
`operator_statements` (the CLI's), `dashboard_statements` and `admin_statements`."""

from __future__ import annotations

from typing import Final, LiteralString

from psycopg import sql

# -- flows and steps -----------------------------------------------------------------------------
#: (flow slug) -> the input schema it was compiled with ("schema"; NULL when it has none).
FLOW_INPUT_SCHEMA: Final[LiteralString] = (
    "select input_schema as schema from pgflow.flows where flow_slug = %s"
)
#: Every compiled flow's slug, in order.
FLOW_SLUGS: Final[LiteralString] = "select flow_slug from pgflow.flows order by flow_slug"


def step_limit_usage(version: str) -> LiteralString:
    """(flow or NULL: every flow) -> each limited step with its limits, who set them, and their
    use now (engine 0017), the spec's limits under them and the operator's override, if one
    stands (engine 0023; an engine of the window older than that has no overrides: NULLs)."""
    return _STEP_LIMIT_USAGE if version >= "0023" else _STEP_LIMIT_USAGE_BEFORE_0023


_STEP_LIMIT_COLUMNS: Final[LiteralString] = (
    "select flow_slug, step_slug, queue_name, max_in_flight, rate_limit, rate_period_s, set_by,"
    " in_flight, window_starts, updated_at,"
)
_STEP_LIMIT_USAGE: Final[LiteralString] = (
    _STEP_LIMIT_COLUMNS
    + " spec_max_in_flight, spec_rate_limit, spec_rate_period_s, overridden_at, overridden_by"
    " from pgflow.step_limit_usage(%s)"
)
#: _STEP_LIMIT_USAGE on engines 0020 to 0022. It goes when the window passes 0022.
_STEP_LIMIT_USAGE_BEFORE_0023: Final[LiteralString] = (
    _STEP_LIMIT_COLUMNS + " null::int as spec_max_in_flight, null::int as spec_rate_limit,"
    " null::int as spec_rate_period_s, null::timestamptz as overridden_at,"
    " null::text as overridden_by from pgflow.step_limit_usage(%s)"
)
#: () -> every keyed step with its key, limit per key, and keys in flight and waiting (0018).
CONCURRENCY_USAGE: Final[LiteralString] = "select * from pgflow.concurrency_usage()"


# -- table triggers (engine 0032) ----------------------------------------------------------------
def has_triggers(version: str) -> bool:
    """Whether an engine at `version` starts runs from table triggers (engine 0032)."""
    return version >= "0032"


# -- run priority (engine 0031) -----------------------------------------------------------------
def has_priority(version: str) -> bool:
    """Whether an engine at `version` starts runs with a priority (engine 0031)."""
    return version >= "0031"


# -- debounced starts (engine 0030) -------------------------------------------------------------
def has_debounce(version: str) -> bool:
    """Whether an engine at `version` debounces starts (engine 0030): pgflow.debounce_start."""
    return version >= "0030"


# -- subflows (engine 0028) ----------------------------------------------------------------------
def has_subflows(version: str) -> bool:
    """Whether an engine at `version` has subflows (engine 0028): runs with parents."""
    return version >= "0028"


#: (run id) -> the run's subflow runs however deep (engine 0028), each after its parent and in
#: task order: depth (1: a child of the run), the parent's task, and the child's state. Only for
#: an engine with subflows (`has_subflows`).
RUN_SUBFLOWS: Final[LiteralString] = (
    "with recursive tree (run_id, depth, path) as ("
    "   select c.run_id, 1, array[row_number() over (order by c.parent_step_slug,"
    "     c.parent_task_index, c.started_at)]"
    "   from pgflow.runs as c where c.parent_run_id = %s"
    "   union all"
    "   select c.run_id, t.depth + 1, t.path || row_number() over (partition by t.run_id"
    "     order by c.parent_step_slug, c.parent_task_index, c.started_at)"
    "   from tree as t join pgflow.runs as c on c.parent_run_id = t.run_id"
    " )"
    " select t.depth, r.run_id, r.parent_run_id, r.parent_step_slug, r.parent_task_index,"
    " r.flow_slug, r.status, r.retry_count"
    " from tree as t join pgflow.runs as r on r.run_id = t.run_id"
    " order by t.path"
)


# -- workers -------------------------------------------------------------------------------------
def workers(version: str) -> LiteralString:
    """(all: include every stopped one) -> workers by queue, oldest first: those not stopped, and
    those stopped within the hour that no later worker of the same name and queue replaced (so
    neither old workers nor `dev`'s restarts pile up), each live, stale,
    deprecated or stopped by the engine's one liveness rule, pgflow.worker_states (engine 0022),
    by which pgflow.queue_coverage counts too; for an engine at `version`
    (`support.version(conn)`)."""
    return _WORKERS if version >= "0022" else _WORKERS_BEFORE_0022


#: Whether the stopped worker `w` is recent and not replaced by a later one of its name.
_SHOWN_STOPPED: Final[LiteralString] = (
    " w.stopped_at > now() - interval '1 hour' and not exists ("
    "   select 1 from pgflow.workers as later where later.function_name = w.function_name"
    "   and later.queue_name = w.queue_name and later.started_at > w.started_at)"
)
_WORKERS: Final[LiteralString] = (
    "select * from pgflow.worker_states() as w"
    " where %s or w.stopped_at is null or" + _SHOWN_STOPPED + " order by queue_name, started_at"
)
#: _WORKERS on engines 0020 and 0021, which have no worker_states: the same rule and columns
#: written out (a test holds the two together). It goes when the window passes 0021.
_WORKERS_BEFORE_0022: Final[LiteralString] = (
    "select worker_id, function_name, flow_slug, step_slug, queue_name, started_at,"
    " last_heartbeat_at, stopped_at, deprecated_at,"
    " case when stopped_at is not null then 'stopped' "
    " when deprecated_at is not null then 'deprecated' "
    " when last_heartbeat_at > now() - (pgflow.worker_liveness()).live_within then 'live' "
    " else 'stale' end as state"
    " from pgflow.workers as w"
    " where %s or w.stopped_at is null or" + _SHOWN_STOPPED + " order by queue_name, started_at"
)


# -- notifications -------------------------------------------------------------------------------
def listen(channel: str) -> sql.Composed:
    """LISTEN to `channel` (any name: it is quoted as an identifier)."""
    return sql.SQL("listen {}").format(sql.Identifier(channel))


def unlisten(channel: str) -> sql.Composed:
    """UNLISTEN `channel`."""
    return sql.SQL("unlisten {}").format(sql.Identifier(channel))

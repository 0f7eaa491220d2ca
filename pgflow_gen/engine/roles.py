"""Least privilege (engine 0019): the engine's group roles, what each may call, and the SQL that
creates and grants them (`pgflow-gen db roles`).

Four group roles (NOLOGIN; grant them to login roles):
- reader reads runs, queues and coverage (dashboards, metrics, `status`);
- client starts, cancels, retries and signals runs, and reads them (a member of reader);
- worker registers, heartbeats, claims, completes and fails tasks, and reads no table but the
  migrations' (which engine version it runs on);
- admin compiles flows, deletes, prunes, pauses and changes limits (a member of client).

Every function a role may call runs as the engine's owner (security definer) and checks its
caller; tables are granted for reading only (reader), never for writing, and not at all to
workers. A step role (`step_statements`) is a login role, a member of worker, that the
engine lets claim, report on and read only its own step's tasks (`pgflow.step_roles`).

The statements are built against a database: grants name each function's exact signature, and
per-step roles need the flow's compiled routes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, LiteralString

import psycopg
from psycopg import sql

from pgflow_gen.errors import DatabaseError, UsageError

#: The kinds of group role, in the order they are created (client includes reader, admin client).
KINDS: Final = ("reader", "client", "worker", "admin")
#: The group roles' default prefix: pgflow_reader, pgflow_client, pgflow_worker, pgflow_admin.
DEFAULT_PREFIX: Final = "pgflow"
#: A prefix: a step role adds "_" and a queue name (at most 47) within PostgreSQL's 63 characters.
PREFIX_PATTERN: Final = re.compile(r"[a-z][a-z0-9_]{0,14}")

#: What to do about a call the engine refused for want of a privilege (SQLSTATE 42501).
PERMISSION_HINT: Final = (
    "This needs a role the engine grants it (pgflow-gen db roles; docs/security.md says which)."
)


def refusal_hint(exc: psycopg.Error) -> str | None:
    """The engine's hint for what it refused, else PERMISSION_HINT for a missing privilege."""
    if exc.diag.message_hint:
        return exc.diag.message_hint
    return PERMISSION_HINT if isinstance(exc, psycopg.errors.InsufficientPrivilege) else None


#: Pure helpers (no table, no write) every role may call.
EVERYONE: Final = (
    "calculate_retry_delay",
    "default_queue_name",
    "derive_queue_routes",
    "is_valid_slug",
    "pgmq_table_name",
    "schema_violation",
    "worker_liveness",
)
#: The engine's functions by the role that may call them (members inherit: client has reader's).
FUNCTIONS: Final[Mapping[str, tuple[str, ...]]] = {
    "reader": (
        "concurrency_usage",
        "find_stalled_tasks",
        "finished_tasks",
        "list_schedules",
        "queue_coverage",
        "step_limit_usage",
        "worker_states",
    ),
    "client": (
        "cancel_run",
        "debounce_start",
        "fork_run",
        "retry_run",
        "send_signal",
        "start_flow",
        "start_flows",
    ),
    "worker": (
        "cancelled_runs",
        "claim_tasks",
        "complete_and_claim",
        "complete_task",
        "complete_tasks",
        "debounced_starts_due_in",
        "enable_insert_notifications",
        "fail_task",
        "heartbeat_worker",
        "list_schedules",
        "mark_worker_stopped",
        "read_and_claim",
        "register_worker",
        "renew_task_leases",
        "requeue_stalled_tasks",
        "run_input",
        "run_trace_contexts",
        "set_vt_batch",
        "start_debounced_runs",
        "start_scheduled_runs",
        "verify_flow_compiled",
    ),
    "admin": (
        "add_step",
        "archive_completed_messages",
        "create_flow",
        "delete_flow_and_data",
        "ensure_flow_compiled",
        "pause_schedule",
        "pause_step",
        "prune_data_older_than",
        "reset_step_limits",
        "resume_schedule",
        "resume_step",
        "set_flow_triggers",
        "set_step_limits",
    ),
}
#: Public functions no group role gets: pgflow's claim without a step selector, which a step role
#: could not be held to (the engine's own workers claim with claim_tasks or read_and_claim).
OWNER_ONLY: Final = ("start_tasks",)

#: The signatures of the engine's functions of the given names: (name, identity arguments).
_SIGNATURES: Final[LiteralString] = (
    "select p.proname, pg_get_function_identity_arguments(p.oid)"
    " from pg_proc as p where p.pronamespace = 'pgflow'::regnamespace"
    " and p.proname = any(%s) order by 1, 2"
)
#: The engine's owner, who creates its queues (default privileges are per creating role).
_OWNER: Final[LiteralString] = (
    "select pg_get_userbyid(nspowner) from pg_namespace where nspname = 'pgflow'"
)
_HAS_ROLES_TABLE: Final[LiteralString] = "select to_regclass('pgflow.engine_roles') is not null"
_RECORDED: Final[LiteralString] = "select kind, role_name from pgflow.engine_roles"
#: A flow's routes: (flow) -> its queue mode and each step's (slug, queue) in step order.
_ROUTES: Final[LiteralString] = (
    "select f.queue_mode, s.step_slug, s.queue_name from pgflow.flows as f"
    " join pgflow.steps as s on s.flow_slug = f.flow_slug"
    " where f.flow_slug = %s order by s.step_index"
)
#: The step roles bound to a step that does not exist (engine 0020 keeps them bound when their
#: flow is deleted or recompiled without the step): (role, flow, step).
_WITHOUT_ROUTE: Final[LiteralString] = (
    "select r.role_name, r.flow_slug, r.step_slug from pgflow.step_roles as r"
    " where not exists (select 1 from pgflow.steps as s"
    "   join pgflow.flows as f on f.flow_slug = s.flow_slug and f.queue_mode = 'step'"
    "   where s.flow_slug = r.flow_slug and s.step_slug = r.step_slug)"
    " order by r.role_name"
)


@dataclass(frozen=True)
class RoleNames:
    """The four group roles' names.

    >>> RoleNames.with_prefix("app").worker
    'app_worker'
    """

    reader: str
    client: str
    worker: str
    admin: str

    @classmethod
    def with_prefix(cls, prefix: str = DEFAULT_PREFIX) -> RoleNames:
        return cls(**{kind: f"{prefix}_{kind}" for kind in KINDS})

    def of(self, kind: str) -> str:
        name: str = getattr(self, kind)
        return name


@dataclass(frozen=True)
class StepRole:
    """A step route's own login role (`db roles --per-step`)."""

    role: str
    flow_slug: str
    step_slug: str


def step_role_name(prefix: str, queue_name: str) -> str:
    """A step role's name: the prefix and the step's queue, which is unique per route.

    >>> step_role_name("pgflow", "orders__charge")
    'pgflow_orders__charge'
    """
    return f"{prefix}_{queue_name}"


def engine_ready(conn: psycopg.Connection[Any]) -> None:
    """Raise DatabaseError when the database's engine predates roles (engine 0019)."""
    row = conn.execute(_HAS_ROLES_TABLE).fetchone()
    if not (row and row[0]):
        raise DatabaseError(
            "This database's engine has no roles yet (engine migration 0019).",
            hint="Run `pgflow-gen db migrate` first.",
        )


def recorded(conn: psycopg.Connection[Any]) -> RoleNames | None:
    """The group roles an earlier `db roles --apply` granted, or None (no roles, or an engine
    before 0019)."""
    row = conn.execute(_HAS_ROLES_TABLE).fetchone()
    if not (row and row[0]):
        return None
    names = dict(conn.execute(_RECORDED).fetchall())
    if set(names) != set(KINDS):
        return None
    return RoleNames(**names)


def group_statements(conn: psycopg.Connection[Any], names: RoleNames) -> list[sql.Composed]:
    """Create the group roles when missing, grant each its functions and reads, and record
    their names; idempotent."""
    owner_row = conn.execute(_OWNER).fetchone()
    owner = sql.Identifier(str(owner_row[0]) if owner_row else "postgres")
    role = {kind: sql.Identifier(names.of(kind)) for kind in KINDS}
    out: list[sql.Composed] = [_comment("the group roles (NOLOGIN: grant them to login roles)")]
    out += [_create_role(names.of(kind), login=False) for kind in KINDS]
    out.append(sql.SQL("grant {} to {};").format(role["reader"], role["client"]))
    out.append(sql.SQL("grant {} to {};").format(role["client"], role["admin"]))
    out.append(
        sql.SQL("grant usage on schema pgflow to {};").format(
            sql.SQL(", ").join(role[kind] for kind in KINDS)
        )
    )
    everyone = sql.SQL(", ").join(role[kind] for kind in ("reader", "worker"))
    out += _execute_grants(conn, EVERYONE, everyone)
    out.append(_comment("reader: reads runs, queues and coverage; writes nothing"))
    out.append(sql.SQL("grant usage on schema pgmq to {};").format(role["reader"]))
    # Sequences too: PGMQ's metrics read each queue's message id sequence.
    for schema in ("pgflow", "pgmq"):
        for objects in ("tables", "sequences"):
            out.append(
                sql.SQL("grant select on all {} in schema {} to {};").format(
                    sql.SQL(objects), sql.Identifier(schema), role["reader"]
                )
            )
            out.append(
                sql.SQL(
                    "alter default privileges for role {} in schema {} grant select on {} to {};"
                ).format(owner, sql.Identifier(schema), sql.SQL(objects), role["reader"])
            )
    for kind in KINDS:
        if kind == "client":
            out.append(_comment("client: starts, cancels, retries and signals runs; reads them"))
            # Engine 0020 records operator actions itself: no role writes the audit trail.
            out.append(
                sql.SQL("revoke insert on pgflow.operator_actions from {};").format(role["client"])
            )
        elif kind == "worker":
            out.append(_comment("worker: claims and reports tasks through functions; no table"))
            # But the engine's version, which workers check once (the support window).
            out.append(
                sql.SQL("grant select on pgflow.schema_migrations to {};").format(role["worker"])
            )
        elif kind == "admin":
            out.append(_comment("admin: compiles, deletes, prunes, pauses, changes limits"))
        out += _execute_grants(conn, FUNCTIONS[kind], role[kind])
    out.append(_comment("what `pgflow-gen db migrate` grants later migrations' functions to"))
    out += [
        sql.SQL(
            "insert into pgflow.engine_roles (kind, role_name) values ({}, {}) on conflict (kind)"
            " do update set role_name = excluded.role_name, granted_at = now();"
        ).format(sql.Literal(kind), sql.Literal(names.of(kind)))
        for kind in KINDS
    ]
    return out


def step_roles(conn: psycopg.Connection[Any], flow_slug: str, prefix: str) -> list[StepRole]:
    """The step roles of a compiled step-queued flow, one per step in step order.

    Raises UsageError for a flow that is not compiled or does not use per-step queues."""
    rows = conn.execute(_ROUTES, (flow_slug,)).fetchall()
    if not rows:
        raise UsageError(
            f'Flow "{flow_slug}" is not compiled in this database.',
            hint="Apply its migration first (`pgflow-gen db apply`), then give its steps roles.",
        )
    if rows[0][0] != "step":
        raise UsageError(
            f'Flow "{flow_slug}" uses one queue for all its steps, so its steps cannot have'
            " roles of their own.",
            hint="Give the flow per-step queues (`queue_mode: step` in its spec) first.",
        )
    return [StepRole(step_role_name(prefix, queue), flow_slug, step) for _, step, queue in rows]


def step_roles_without_route(conn: psycopg.Connection[Any]) -> list[StepRole]:
    """The step roles whose step does not exist (any more): they work on nothing (engine 0020)
    until their flow is applied again with that step; none on an engine without step roles."""
    if conn.execute("select to_regclass('pgflow.step_roles') is null").fetchone() == (True,):
        return []
    return [StepRole(*row) for row in conn.execute(_WITHOUT_ROUTE).fetchall()]


def step_statements(roles: Sequence[StepRole], names: RoleNames) -> list[sql.Composed]:
    """Create each step's login role (a member of worker, without a password) and tie it to its
    route in pgflow.step_roles; idempotent."""
    out: list[sql.Composed] = []
    for item in roles:
        out.append(_comment(f'step "{item.step_slug}" of flow "{item.flow_slug}"'))
        out.append(_create_role(item.role, login=True))
        out.append(
            sql.SQL("grant {} to {};").format(
                sql.Identifier(names.worker), sql.Identifier(item.role)
            )
        )
        out.append(
            sql.SQL(
                "insert into pgflow.step_roles (role_name, flow_slug, step_slug)"
                " values ({}, {}, {}) on conflict (role_name) do update"
                " set flow_slug = excluded.flow_slug, step_slug = excluded.step_slug;"
            ).format(
                sql.Literal(item.role), sql.Literal(item.flow_slug), sql.Literal(item.step_slug)
            )
        )
    if roles:
        out.append(
            _comment(
                "then give each its secret, e.g. alter role "
                f"{roles[0].role} password '...'; (or a client certificate)"
            )
        )
    return out


def render(conn: psycopg.Connection[Any], statements: Sequence[sql.Composed]) -> str:
    """The statements as a script, one per line."""
    return "".join(statement.as_string(conn) + "\n" for statement in statements)


def apply(conn: psycopg.Connection[Any], statements: Sequence[sql.Composed]) -> None:
    """Run the statements as one script in one transaction (one round trip): all or none."""
    with conn.transaction():
        conn.execute(sql.SQL("\n").join(statements))


def _execute_grants(
    conn: psycopg.Connection[Any], names: Sequence[str], grantees: sql.Composable
) -> list[sql.Composed]:
    """A grant of EXECUTE per existing function (every overload) of these names."""
    rows = conn.execute(_SIGNATURES, (list(names),)).fetchall()
    # The argument lists are PostgreSQL's own rendering of the catalog's types: SQL as it is.
    return [
        sql.SQL("grant execute on function {}.{}({}) to {};").format(
            sql.Identifier("pgflow"),
            sql.Identifier(name),
            sql.SQL(arguments),
            grantees,
        )
        for name, arguments in rows
    ]


def _create_role(name: str, *, login: bool) -> sql.Composed:
    """CREATE ROLE unless it exists (PostgreSQL has no IF NOT EXISTS for roles)."""
    return sql.SQL(
        "do $$ begin create role {} {}; exception when duplicate_object then null; end $$;"
    ).format(sql.Identifier(name), sql.SQL("login" if login else "nologin"))


def _comment(text: str) -> sql.Composed:
    """A comment line; the text is ours or a validated slug (no newline)."""
    return sql.SQL("-- {}").format(sql.SQL(" ".join(text.split())))

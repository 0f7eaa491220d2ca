"""The `pgflow-gen db` commands: the project's embedded server (`start`, `stop`, `url`), what a
database has (`status`), the engine (`migrate`, `sql`), its roles (`roles`) and the generated
flow migrations (`apply`, `export`; flow_sql.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import psycopg

from pgflow_gen.cli import connecting, flow_sql
from pgflow_gen.cli import parser as cli_parser
from pgflow_gen.cli import project as project_module
from pgflow_gen.cli.exits import EXIT_OK
from pgflow_gen.engine import operator_statements, statements, support
from pgflow_gen.engine import roles as roles_module
from pgflow_gen.errors import PgflowError, UsageError
from pgflow_gen.runtime import database, migrations
from pgflow_gen.runtime.sql import shipped
from pgflow_gen.words import counted


def register(commands: cli_parser.Commands) -> None:
    """Add the `db` group to the `pgflow-gen` parser."""
    db = commands.group("db", "manage the database: embedded server, PGMQ, engine")
    db.add("start", "start the project's embedded PostgreSQL").set_defaults(handler=_db_start)
    db.add("stop", "stop the project's embedded PostgreSQL").set_defaults(handler=_db_stop)
    db.add("url", "print the database URL", database=True).set_defaults(handler=_db_url)
    db.add("status", "show the server, PGMQ and engine migrations", database=True).set_defaults(
        handler=_db_status
    )
    migrate = db.add(
        "migrate", "install PGMQ if missing and apply engine migrations", database=True
    )
    migrate.add_argument(
        "--target", metavar="NNNN", help="stop after this migration (default: the newest)"
    )
    migrate.set_defaults(handler=_db_migrate)
    apply = db.add(
        "apply", "apply the generated flow migrations (idempotent; one transaction each)",
        database=True,
    )  # fmt: skip
    apply.add_argument(
        "folder",
        nargs="?",
        type=Path,
        help="the build output folder or its migrations/ (default: [tool.pgflow-gen] out)",
    )
    apply.set_defaults(handler=_db_apply)
    export = db.add(
        "export", "write the flow migrations as versioned files for another migration tool"
    )
    export.add_argument("target", type=Path, help="the folder your migration tool reads")
    export.add_argument(
        "--style", choices=flow_sql.STYLES, required=True, help="the migration tool's file format"
    )
    export.add_argument(
        "--from",
        dest="folder",
        type=Path,
        help="the build output folder (default: [tool.pgflow-gen] out)",
    )
    export.add_argument(
        "--first-version",
        type=int,
        default=1,
        metavar="N",
        help="the number of the first file in a new target folder (Supabase: a timestamp-like"
        " number after your own migrations)",
    )
    export.set_defaults(handler=_db_export)
    roles = db.add(
        "roles",
        "print (or --apply) the engine's group roles and their grants (least privilege)",
        database=True,
    )
    roles.add_argument(
        "--apply", action="store_true", help="run the statements (one transaction) instead"
    )
    roles.add_argument(
        "--prefix",
        default=roles_module.DEFAULT_PREFIX,
        metavar="NAME",
        help="the roles are NAME_reader, NAME_client, NAME_worker, NAME_admin (default: pgflow)",
    )
    roles.add_argument(
        "--per-step",
        action="append",
        metavar="FLOW",
        help="also one login role per step of FLOW (per-step queues), held to its own step;"
        " repeatable",
    )
    roles.set_defaults(handler=_db_roles)
    sql = db.add("sql", "print the engine SQL for other migration tools")
    sql.add_argument("--with-pgmq", action="store_true", help="prepend PGMQ's own install SQL")
    sql.set_defaults(handler=_db_sql)


def _db_start(args: argparse.Namespace) -> int:
    server = connecting.embedded_server()
    was_running = server.is_running()
    url = server.ensure_started()
    print(f"{'already running' if was_running else 'started'}: {url}")
    print(f"project: {connecting.server_root()}")
    print(f"data: {server.pgdata}")
    return EXIT_OK


def _db_stop(args: argparse.Namespace) -> int:
    server = connecting.embedded_server()
    live = _live_workers(server.url()) if server.is_running() else []
    if live:
        names = ", ".join(f"{w['function_name']} ({w['queue_name']})" for w in live[:LISTED])
        more = f" and {len(live) - LISTED} more" if len(live) > LISTED else ""
        print(
            f"stopping the database under {counted(len(live), 'live worker')}: {names}{more};"
            " they wait"
            " for it and go on when it starts again (or stop them first)",
            file=sys.stderr,
        )
    stopped = server.stop()
    print("stopped" if stopped else "not running")
    return EXIT_OK


#: The live workers `db stop` names at most.
LISTED = 5


def _live_workers(url: str) -> list[dict[str, Any]]:
    """The workers the engine calls live now; none when it cannot tell (no engine yet)."""
    try:
        with connecting.connect_to(url) as conn:
            rows = conn.execute(statements.workers(support.version(conn)), (False,)).fetchall()
    except (PgflowError, psycopg.Error):
        return []
    return [row for row in rows if row["state"] == "live"]


def _db_url(args: argparse.Namespace) -> int:
    # Without its password, as everywhere the CLI prints a URL: the configuration holds it.
    print(database.redact(connecting.database_url(args.database_url)))
    return EXIT_OK


def _db_status(args: argparse.Namespace) -> int:
    configured = database.configured_url(args.database_url)
    if configured is None:
        server = connecting.embedded_server()
        print(f"server:     embedded, {'running' if server.is_running() else 'stopped'}")
        print(f"data:       {server.pgdata}")
        if not server.is_running():
            return EXIT_OK
    url = connecting.database_url(args.database_url)
    print(f"url:        {database.redact(url)}")
    with psycopg.connect(url, autocommit=True) as conn:
        version = conn.execute(operator_statements.SERVER_VERSION).fetchone()
        print(f"postgresql: {version[0] if version else '?'}")
        print(f"pgmq:       {_pgmq_version(conn) or 'not installed'}")
        done = migrations.applied(conn)
        for migration in shipped.available():
            state = "applied" if migration.version in done else "pending"
            print(f"migration:  {migration.version}_{migration.name} {state}")
    return EXIT_OK


def _pgmq_version(conn: psycopg.Connection[Any]) -> str | None:
    row = conn.execute(operator_statements.PGMQ_VERSION).fetchone()
    return None if row is None or row[0] is None else str(row[0])


def _db_migrate(args: argparse.Namespace) -> int:
    url = connecting.database_url(args.database_url)
    with psycopg.connect(url, autocommit=True) as conn:
        installed = migrations.ensure_pgmq(conn)
        if installed:
            print(f"installed PGMQ {installed} (SQL)")
        done = migrations.migrate(
            conn,
            target=args.target,
            on_apply=lambda m: print(f"applying {m.version}_{m.name} ...", flush=True),
        )
        # Functions a migration added go to the roles `db roles --apply` granted before (and
        # a grant revoked by hand comes back).
        names = roles_module.recorded(conn)
        if names is not None:
            roles_module.apply(conn, roles_module.group_statements(conn, names))
    print(f"applied {counted(len(done), 'migration')}" if done else "engine is up to date")
    if names is not None:
        print(f"granted again: {', '.join(names.of(kind) for kind in roles_module.KINDS)}")
    return EXIT_OK


def _generated_folder(folder: Path | None) -> Path:
    if folder is not None:
        return folder
    out = project_module.config(Path.cwd()).get("out")
    if out is None:
        raise UsageError(
            "Pass the build output folder, or set `out` under [tool.pgflow-gen] in pyproject.toml."
        )
    return Path(out)


def _db_apply(args: argparse.Namespace) -> int:
    files = flow_sql.migration_files(_generated_folder(args.folder))
    url = connecting.database_url(args.database_url)
    with psycopg.connect(url, autocommit=True) as conn:
        flow_sql.apply(conn, files, lambda done: print(f"{done.outcome} ({done.path})"))
    return EXIT_OK


def _db_export(args: argparse.Namespace) -> int:
    if args.first_version < 1:
        raise UsageError("--first-version must be at least 1.")
    files = flow_sql.migration_files(_generated_folder(args.folder))
    written = flow_sql.export(files, args.target, args.style, first_version=args.first_version)
    for item in written:
        print(f"wrote   {item.path} (flow {item.flow})")
    print(f"{len(written)} written, {len(files) - len(written)} unchanged")
    return EXIT_OK


def _db_roles(args: argparse.Namespace) -> int:
    if not roles_module.PREFIX_PATTERN.fullmatch(args.prefix):
        raise UsageError(
            f"--prefix {args.prefix!r} is not a role name prefix.",
            hint="Use up to 15 lower-case letters, digits and underscores, starting with a"
            " letter (say, app): a step role's name adds a queue name of up to 47 characters.",
        )
    names = roles_module.RoleNames.with_prefix(args.prefix)
    url = connecting.database_url(args.database_url)
    with psycopg.connect(url, autocommit=True) as conn:
        roles_module.engine_ready(conn)
        statements = roles_module.group_statements(conn, names)
        step_roles = [
            role
            for flow in args.per_step or ()
            for role in roles_module.step_roles(conn, flow, args.prefix)
        ]
        statements += roles_module.step_statements(step_roles, names)
        unbound = roles_module.step_roles_without_route(conn)
        if not args.apply:
            print(roles_module.render(conn, statements), end="")
            for role in unbound:
                print(f"-- {_unbound(role)}")
            return EXIT_OK
        roles_module.apply(conn, statements)
    print(f"roles: {', '.join(names.of(kind) for kind in roles_module.KINDS)} granted")
    for role in step_roles:
        print(f'step role: {role.role} (step "{role.step_slug}" of flow "{role.flow_slug}")')
    if step_roles:
        print("next: give each step role its secret (alter role ... password '...')")
    for role in unbound:
        print(f"warning: {_unbound(role)}")
    return EXIT_OK


def _unbound(role: roles_module.StepRole) -> str:
    return (
        f'step role {role.role} works on nothing: step "{role.step_slug}" of flow'
        f' "{role.flow_slug}" does not exist (apply the flow again, or drop role {role.role})'
    )


def _db_sql(args: argparse.Namespace) -> int:
    if args.with_pgmq:
        script, version = migrations.pgmq_sql()
        print(f"-- PGMQ {version} (from the pgmq package)\n{script}")
    print(migrations.engine_script(), end="")
    return EXIT_OK

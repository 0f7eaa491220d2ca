"""The `pgflow-gen` command line.

Exit codes: 0 success, 1 failure (a stale --check, a failed run, a database error), 2 usage error
(an invalid spec, a bad option, an unknown flow), 70 internal error (a bug: one line, and the
traceback with --debug or PGFLOW_DEBUG=1), 130 interrupted. A closed pipe (`... | head`) ends the
command quietly, as coreutils tools do. Only `main` turns errors into messages and exit codes.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from pgflow_gen import cli_ops, cli_parser, cli_queries, devloop, flow_sql, naming
from pgflow_gen import project as project_module
from pgflow_gen.codegen import build as build_module
from pgflow_gen.codegen import graph as graph_module
from pgflow_gen.codegen import scaffold
from pgflow_gen.errors import UsageError
from pgflow_gen.runtime import database, embedded, errors, migrations
from pgflow_gen.spec import loader
from pgflow_gen.spec import problems as problems_module

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 70  # EX_SOFTWARE of sysexits.h
EXIT_INTERRUPTED = 128 + signal.SIGINT
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # what a shell reports for a tool killed by SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "handler"):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    debug = bool(getattr(args, "debug", False)) or os.environ.get("PGFLOW_DEBUG", "") not in (
        "",
        "0",
    )
    try:
        code = _run(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handlers below
    except BrokenPipeError:
        # Point stdout at /dev/null so the interpreter's own flush at exit stays quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if debug:
            traceback.print_exc()
        message = str(exc).splitlines()[0] if str(exc) else ""
        print(
            f"internal error: {type(exc).__name__}: {message}; rerun with --debug for the"
            " traceback",
            file=sys.stderr,
        )
        return EXIT_INTERNAL
    return code


def _run(args: argparse.Namespace) -> int:
    """Run the command; the user's mistakes and the environment's failures become messages."""
    try:
        cli_parser.settle(args)
        code: int = args.handler(args)
    except (UsageError, naming.FlowSpecError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except errors.PgflowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except OSError as exc:  # a file or folder of the user's that cannot be read or written
        if isinstance(exc, BrokenPipeError):
            raise
        where = f": {exc.filename}" if exc.filename else ""
        print(f"error: {exc.strerror or exc}{where}", file=sys.stderr)
        return EXIT_FAILURE
    except psycopg.Error as exc:
        return _database_error(exc)
    return code


def _database_error(exc: psycopg.Error) -> int:
    """Print what the database (or libpq) refused, without any password the URL holds."""
    problem = database.config_problem(exc)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
    elif isinstance(exc, psycopg.OperationalError):
        reason = database.redact(str(exc)).rstrip()
        print(f"error: cannot reach the database: {reason}", file=sys.stderr)
    else:
        diag = exc.diag
        print(f"error: {diag.message_primary or exc}", file=sys.stderr)
        for label, text in (("detail", diag.message_detail), ("hint", diag.message_hint)):
            if text:
                print(f"  {label}: {text}", file=sys.stderr)
    return EXIT_FAILURE


def _parser() -> argparse.ArgumentParser:
    parser = cli_parser.parser(
        prog="pgflow-gen", description="Typed, durable workflows on PostgreSQL + PGMQ."
    )
    parser.add_argument("--version", action="version", version=_version())
    commands = cli_parser.Commands(parser.add_subparsers(title="commands"))

    init = commands.add("init", "create a project: a flow, typed handlers, a test")
    init.add_argument(
        "folder", nargs="?", type=Path, default=Path("."), help="the project folder (created)"
    )
    init.set_defaults(handler=_init)

    dev = commands.add(
        "dev", "build, migrate and run every worker; rebuild and restart on changes", database=True
    )
    dev.set_defaults(handler=_dev)

    validate = commands.add(
        "validate", "check flow spec files (exit 2 when invalid)", formats=("text", "json")
    )
    validate.add_argument(
        "paths",
        nargs="*",
        type=Path,
        help="spec files or folders of *.yaml (default: [tool.pgflow-gen] specs)",
    )
    validate.set_defaults(handler=_validate)

    build = commands.add("build", "generate typed modules, workers and migrations")
    build.add_argument(
        "paths",
        nargs="*",
        type=Path,
        help="spec files or folders (default: [tool.pgflow-gen] specs)",
    )
    build.add_argument(
        "--out", type=Path, help="output folder, e.g. app/pgflow (default: [tool.pgflow-gen] out)"
    )
    build.add_argument(
        "--package",
        help="Python package of --out (default: [tool.pgflow-gen] package, else derived from the"
        " path)",
    )
    build.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 with a diff when stale"
    )
    build.set_defaults(handler=_build)

    graph = commands.add(
        "graph",
        "print flow DAGs (Mermaid or Graphviz DOT)",
        formats=("mermaid", "dot"),
        format_help="graph language",
    )
    graph.add_argument("paths", nargs="+", type=Path, help="spec files or folders of *.yaml")
    graph.set_defaults(handler=_graph)

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
    sql = db.add("sql", "print the engine SQL for other migration tools")
    sql.add_argument("--with-pgmq", action="store_true", help="prepend PGMQ's own install SQL")
    sql.set_defaults(handler=_db_sql)

    cli_ops.register(commands)
    cli_parser.accept_everywhere(parser, "--debug", help="show the traceback of an internal error")
    return parser


def _version() -> str:
    try:
        version = importlib.metadata.version("pgflow-gen")
    except importlib.metadata.PackageNotFoundError:  # a checkout that is not installed
        version = "unknown"
    engine = migrations.available()[-1].version
    return f"pgflow-gen {version} (engine {engine})"


def _init(args: argparse.Namespace) -> int:
    folder: Path = args.folder
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{folder} exists and is not a folder.")
    name = scaffold.project_name(folder.resolve().name)
    files = scaffold.project_files(name)
    taken = [path for path in files if (folder / path).exists()]
    if taken:
        raise UsageError(
            f"{folder} already has {', '.join(taken)}; init writes nothing over existing files.",
            hint="Run it in a new or empty folder: `pgflow-gen init my-flows`.",
        )
    for path, text in files.items():
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("x", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        print(f"created {target}")
    print("\nnext:")
    if folder.resolve() != Path.cwd().resolve():
        print(f"  cd {folder}")
    print("  pgflow-gen build   # generate app/pgflow from flows/hello.yaml")
    print("  pytest -q          # run tests/test_hello.py through the engine")
    print("  pgflow-gen dev     # run every worker; rebuild and restart on changes")
    return EXIT_OK


def _dev(args: argparse.Namespace) -> int:
    settings = devloop.Settings.of(Path.cwd())
    return devloop.DevLoop(settings, args.database_url).run()


def _validate(args: argparse.Namespace) -> int:
    problems: list[problems_module.Problem] = []
    paths = args.paths or [Path(p) for p in project_module.config(Path.cwd()).get("specs", [])]
    if not paths:
        raise UsageError(
            "pass spec files or folders, or set `specs` under [tool.pgflow-gen] in pyproject.toml."
        )
    args.paths = paths
    files = project_module.spec_files(paths)
    try:
        build_module.load(files, project=Path.cwd())
    except problems_module.SpecErrors as exc:
        problems.extend(exc.problems)
    if not files:
        problems.append(
            problems_module.Problem(
                "no_specs",
                "No spec files found.",
                problems_module.Location(", ".join(str(p) for p in args.paths)),
                hint="Pass *.yaml files or folders that contain them.",
            )
        )
    if args.format == "json":
        print(json.dumps({"ok": not problems, "errors": [p.to_json() for p in problems]}, indent=2))
    else:
        for problem in problems:
            print(problem.render(), file=sys.stderr)
        if not problems:
            print(f"{len(files)} spec file(s) valid")
        else:
            print(f"{len(problems)} problem(s) in {len(files)} file(s)", file=sys.stderr)
    return EXIT_OK if not problems else EXIT_USAGE


def _build(args: argparse.Namespace) -> int:
    project = Path.cwd()
    config = project_module.config(project)
    paths = args.paths or [Path(p) for p in config.get("specs", [])]
    out = args.out or (Path(config["out"]) if "out" in config else None)
    if not paths or out is None:
        print(
            "error: pass spec paths and --out, or set `specs` and `out` under [tool.pgflow-gen]"
            " in pyproject.toml",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a folder.")
    args.out = out
    files = project_module.spec_files(paths)
    try:
        package = args.package or config.get("package") or build_module.package_for(out, project)
        generated = build_module.generate(files, package=package, project=project)
    except problems_module.SpecErrors as exc:
        for problem in exc.problems:
            print(problem.render(), file=sys.stderr)
        return EXIT_USAGE
    except naming.FlowSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    outcome = build_module.apply(generated, args.out, check=args.check)
    if args.check:
        if outcome.stale:
            sys.stdout.write("".join(outcome.diffs))
            print(
                f"{len(outcome.written)} changed or missing, {len(outcome.removed)} orphaned:"
                " run `pgflow-gen build` and commit the result",
                file=sys.stderr,
            )
            return EXIT_FAILURE
        print(f"{outcome.unchanged} generated file(s) are current")
        return EXIT_OK
    for path in outcome.written:
        print(f"wrote   {args.out / path}")
    for path in outcome.removed:
        print(f"removed {args.out / path}")
    print(
        f"{len(outcome.written)} written, {len(outcome.removed)} removed,"
        f" {outcome.unchanged} unchanged"
    )
    return EXIT_OK


def _graph(args: argparse.Namespace) -> int:
    files = project_module.spec_files(args.paths)
    if not files:
        raise UsageError(
            f"No spec files found in {', '.join(map(str, args.paths))}.",
            hint="Pass *.yaml files or folders that contain them.",
        )
    problems: list[problems_module.Problem] = []
    graphs = []
    for path in files:
        try:
            spec = loader.load_file(path, display_name=build_module.display_path(path, Path.cwd()))
        except problems_module.SpecErrors as exc:
            problems.extend(exc.problems)
            continue
        graphs.append(graph_module.render(spec, args.format))
    if problems:
        for problem in problems:
            print(problem.render(), file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.write("\n".join(graphs))
    return EXIT_OK


def _server() -> embedded.EmbeddedServer:
    return embedded.EmbeddedServer.for_project(Path.cwd())


def _db_start(args: argparse.Namespace) -> int:
    server = _server()
    was_running = server.is_running()
    url = server.ensure_started()
    print(f"{'already running' if was_running else 'started'}: {url}")
    print(f"data: {server.pgdata}")
    return EXIT_OK


def _db_stop(args: argparse.Namespace) -> int:
    stopped = _server().stop()
    print("stopped" if stopped else "not running")
    return EXIT_OK


def _db_url(args: argparse.Namespace) -> int:
    print(database.resolve_url(args.database_url))
    return EXIT_OK


def _db_status(args: argparse.Namespace) -> int:
    configured = database.configured_url(args.database_url)
    if configured is None:
        server = _server()
        print(f"server:     embedded, {'running' if server.is_running() else 'stopped'}")
        print(f"data:       {server.pgdata}")
        if not server.is_running():
            return EXIT_OK
    url = database.resolve_url(args.database_url)
    print(f"url:        {url}")
    with psycopg.connect(url, autocommit=True) as conn:
        version = conn.execute(cli_queries.SERVER_VERSION).fetchone()
        print(f"postgresql: {version[0] if version else '?'}")
        print(f"pgmq:       {_pgmq_version(conn) or 'not installed'}")
        done = migrations.applied(conn)
        for migration in migrations.available():
            state = "applied" if migration.version in done else "pending"
            print(f"migration:  {migration.version}_{migration.name} {state}")
    return EXIT_OK


def _pgmq_version(conn: psycopg.Connection[Any]) -> str | None:
    row = conn.execute(cli_queries.PGMQ_VERSION).fetchone()
    return None if row is None or row[0] is None else str(row[0])


def _db_migrate(args: argparse.Namespace) -> int:
    url = database.resolve_url(args.database_url)
    with psycopg.connect(url, autocommit=True) as conn:
        installed = migrations.ensure_pgmq(conn)
        if installed:
            print(f"installed PGMQ {installed} (SQL)")
        done = migrations.migrate(
            conn,
            target=args.target,
            on_apply=lambda m: print(f"applying {m.version}_{m.name} ...", flush=True),
        )
    print(f"applied {len(done)} migration(s)" if done else "engine is up to date")
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
    url = database.resolve_url(args.database_url)
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


def _db_sql(args: argparse.Namespace) -> int:
    if args.with_pgmq:
        script, version = migrations.pgmq_sql()
        print(f"-- PGMQ {version} (from the pgmq package)\n{script}")
    print(migrations.engine_script(), end="")
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())

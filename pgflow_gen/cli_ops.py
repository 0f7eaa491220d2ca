"""Operations commands of `pgflow-gen`: start and watch runs, list workers, check queue coverage.

They talk to the database in SQL only, so they work for any flow without its Python module.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any, TextIO

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from pgflow_gen.errors import UsageError
from pgflow_gen.runtime import Client, database, errors

EXIT_OK = 0
EXIT_FAILURE = 1


def register(commands: Any, url_option: argparse.ArgumentParser) -> None:
    """Add the operations commands to the `pgflow-gen` parser."""
    start = commands.add_parser("start", parents=[url_option], help="start a run of a flow")
    start.add_argument("flow_slug", metavar="SLUG")
    start.add_argument("--input", default="{}", help="the run input as JSON (default {})")
    start.add_argument("--wait", action="store_true", help="wait until the run finishes")
    start.add_argument("--timeout", type=float, default=300.0, help="seconds --wait waits")
    start.set_defaults(handler=_start)

    status = commands.add_parser("status", parents=[url_option], help="show a run and its steps")
    status.add_argument("run_id", metavar="RUN_ID", type=uuid.UUID)
    status.set_defaults(handler=_status)

    runs = commands.add_parser("runs", parents=[url_option], help="list recent runs")
    runs.add_argument("--flow", dest="flow_slug", metavar="SLUG", help="only runs of this flow")
    runs.add_argument("--limit", type=int, default=20)
    runs.set_defaults(handler=_runs)

    workers = commands.add_parser("workers", parents=[url_option], help="list workers")
    workers.add_argument("--all", action="store_true", help="include stopped workers")
    workers.set_defaults(handler=_workers)

    coverage = commands.add_parser(
        "coverage",
        parents=[url_option],
        help="does every queue route have a live worker? (exit 1 when not)",
    )
    coverage.add_argument(
        "--freshness", type=float, default=15.0, metavar="S", help="max heartbeat age (15 s)"
    )
    coverage.add_argument("--flow", dest="flow_slug", metavar="SLUG", help="only this flow")
    coverage.add_argument("--format", choices=("text", "json"), default="text")
    coverage.set_defaults(handler=_coverage)


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], out: TextIO) -> None:
    """Print rows as aligned columns under their headers.

    >>> import sys
    >>> table([("a", 1), ("bcd", 22)], ["name", "n"], sys.stdout)
    name  n
    ----  --
    a     1
    bcd   22
    """
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = [list(headers), ["-" * w for w in widths], *cells]
    for line in lines:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip(), file=out)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime.datetime):
        return value.astimezone().strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _require_flow(conn: psycopg.Connection[dict[str, Any]], flow_slug: str) -> None:
    """Raise UsageError when no flow `flow_slug` is compiled (a typo would look like no data)."""
    rows = conn.execute("select flow_slug from pgflow.flows order by flow_slug").fetchall()
    known = [row["flow_slug"] for row in rows]
    if flow_slug in known:
        return
    near = [slug for slug in known if slug.lower() == flow_slug.lower()]
    raise UsageError(
        f'No flow "{flow_slug}" is compiled in this database.',
        hint=f'Did you mean "{near[0]}"? Slugs are exact.'
        if near
        else f"Compiled flows: {', '.join(known) or '(none)'}.",
    )


def _connect(args: argparse.Namespace) -> psycopg.Connection[dict[str, Any]]:
    url = database.resolve_url(args.database_url)
    return psycopg.connect(url, autocommit=True, row_factory=dict_row)


def _start(args: argparse.Namespace) -> int:
    try:
        run_input = json.loads(args.input)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"--input is not JSON: {exc}", hint='For example --input \'{"name": "Ada"}\'.'
        ) from None
    with _connect(args) as conn:
        row = conn.execute(
            "select run_id from pgflow.start_flow(%s, %s)", (args.flow_slug, Jsonb(run_input))
        ).fetchone()
    assert row is not None
    run_id: uuid.UUID = row["run_id"]
    print(f"started run {run_id} of {args.flow_slug}")
    if not args.wait:
        return EXIT_OK
    client = Client(database.resolve_url(args.database_url))
    run = _wait_with_progress(client, run_id, args.timeout)
    print(f"{run.status}: {json.dumps(run.output)}")
    return EXIT_OK if run.status == "completed" else EXIT_FAILURE


def _wait_with_progress(client: Client, run_id: uuid.UUID, timeout: float) -> Any:
    """Wait for the run (events, plus a read every second, which also works behind a
    transaction pooler); a terminal shows the elapsed time."""
    started = time.monotonic()
    show = sys.stderr.isatty()

    def tick() -> None:
        if show:
            elapsed = time.monotonic() - started
            print(f"\rwaiting for run {run_id} ... {elapsed:4.0f} s", end="", file=sys.stderr)

    try:
        return client.get_run(run_id).wait(timeout, every_second=tick)
    except TimeoutError:
        raise errors.PgflowError(
            f"Run {run_id} is still running after {timeout:g} s.",
            hint=f"Check it later with `pgflow-gen status {run_id}`.",
        ) from None
    finally:
        if show:
            print(file=sys.stderr)


def _status(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        run = conn.execute("select * from pgflow.runs where run_id = %s", (args.run_id,)).fetchone()
        if run is None:
            raise errors.PgflowError(f"Run {args.run_id} does not exist.")
        steps = conn.execute(
            "select ss.step_slug, ss.status, s.queue_name, ss.initial_tasks, ss.remaining_tasks,"
            " coalesce(ss.error_message, ss.skip_reason) as note"
            " from pgflow.step_states as ss"
            " join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug"
            " where ss.run_id = %s order by s.step_index",
            (args.run_id,),
        ).fetchall()
    print(f"run:     {run['run_id']}")
    print(f"flow:    {run['flow_slug']}")
    print(f"status:  {run['status']}")
    print(f"started: {_cell(run['started_at'])}")
    finished = run["completed_at"] or run["failed_at"]
    if finished is not None:
        print(f"ended:   {_cell(finished)}")
    print(f"input:   {_cell(run['input'])}")
    print(f"output:  {_cell(run['output'])}")
    print()
    table(
        [
            (s["step_slug"], s["status"], s["queue_name"], s["initial_tasks"], s["note"])
            for s in steps
        ],
        ["step", "status", "queue", "tasks", "note"],
        sys.stdout,
    )
    return EXIT_OK


def _runs(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise UsageError("--limit must be at least 1.")
    with _connect(args) as conn:
        if args.flow_slug is not None:
            _require_flow(conn, args.flow_slug)
        rows = conn.execute(
            "select run_id, flow_slug, status, started_at,"
            " coalesce(completed_at, failed_at) as ended from pgflow.runs"
            " where %(flow)s::text is null or flow_slug = %(flow)s"
            " order by started_at desc limit %(limit)s",
            {"flow": args.flow_slug, "limit": args.limit},
        ).fetchall()
    table(
        [(r["run_id"], r["flow_slug"], r["status"], r["started_at"], r["ended"]) for r in rows],
        ["run", "flow", "status", "started", "ended"],
        sys.stdout,
    )
    return EXIT_OK


def _workers(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        rows = conn.execute(
            "select worker_id, function_name, flow_slug, step_slug, queue_name, last_heartbeat_at,"
            " case when stopped_at is not null then 'stopped'"
            "  when deprecated_at is not null then 'deprecated'"
            "  when last_heartbeat_at < now() - interval '15 seconds' then 'stale'"
            "  else 'live' end as state"
            " from pgflow.workers where %s or stopped_at is null"
            " order by queue_name, started_at",
            (args.all,),
        ).fetchall()
    table(
        [
            (r["function_name"], r["state"], r["queue_name"], r["step_slug"],
             r["last_heartbeat_at"], r["worker_id"])
            for r in rows
        ],
        ["worker", "state", "queue", "step", "last heartbeat", "id"],
        sys.stdout,
    )  # fmt: skip
    return EXIT_OK


def _coverage(args: argparse.Namespace) -> int:
    if args.freshness <= 0:
        raise UsageError("--freshness must be above 0 seconds.")
    with _connect(args) as conn:
        if args.flow_slug is not None:
            _require_flow(conn, args.flow_slug)
        rows = conn.execute(
            "select * from pgflow.queue_coverage(make_interval(secs => %s))"
            " where %s::text is null or flow_slug = %s",
            (args.freshness, args.flow_slug, args.flow_slug),
        ).fetchall()
    uncovered = [r for r in rows if not r["covered"]]
    if args.format == "json":
        print(json.dumps({"ok": not uncovered, "routes": rows}, indent=2))
    else:
        table(
            [
                (r["flow_slug"], r["step_slug"], r["queue_name"], r["live_workers"],
                 "yes" if r["covered"] else "NO")
                for r in rows
            ],
            ["flow", "step", "queue", "live workers", "covered"],
            sys.stdout,
        )  # fmt: skip
        print(
            f"\n{len(rows) - len(uncovered)} of {len(rows)} route(s) covered"
            f" (heartbeat within {args.freshness:g} s)"
        )
    return EXIT_FAILURE if uncovered else EXIT_OK

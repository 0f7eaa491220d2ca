"""`pgflow-gen schedules`: the flows' schedules with their next and last runs, and `schedules
pause|resume FLOW NAME`.

The workers start scheduled runs (setting `schedules`, one worker per database at a time); the
engine keeps each schedule and starts one run per slot (docs/schedules.md).
"""

from __future__ import annotations

import argparse
import datetime
import sys
import zoneinfo
from typing import Any

import psycopg

from pgflow_gen.cli import connecting, existing, runs
from pgflow_gen.cli import parser as cli_parser
from pgflow_gen.cli.exits import EXIT_OK
from pgflow_gen.cli.output import cell, print_json, table
from pgflow_gen.engine import operator_statements
from pgflow_gen.errors import UsageError
from pgflow_gen.runtime.client import operations
from pgflow_gen.runtime.worker import cron_slots as schedule_rules


def register(commands: cli_parser.Commands) -> None:
    """Add `schedules` to the `pgflow-gen` parser."""
    command = commands.add(
        "schedules",
        "list the flows' schedules with their next and last runs, or pause or resume one",
        database=True,
        formats=runs.FORMATS,
    )
    command.add_argument(
        "action", nargs="?", choices=("list", "pause", "resume"), default="list",
        help="list (the default), pause or resume",
    )  # fmt: skip
    command.add_argument("flow_slug", metavar="FLOW", nargs="?", help="the flow")
    command.add_argument("name", metavar="NAME", nargs="?", help="the schedule's name")
    command.add_argument("--flow", dest="only_flow", metavar="SLUG", help="list only this flow's")
    command.set_defaults(handler=_schedules)


def _schedules(args: argparse.Namespace) -> int:
    if args.action == "list":
        if args.flow_slug is not None:
            raise UsageError(
                "`schedules` lists every schedule; name a flow with --flow.",
                hint="For example `pgflow-gen schedules --flow nightlyReport`.",
            )
        return _list(args)
    if args.flow_slug is None or args.name is None:
        raise UsageError(
            f"Name the flow and the schedule to {args.action}.",
            hint=f"For example `pgflow-gen schedules {args.action} nightlyReport nightly`;"
            " `pgflow-gen schedules` lists them.",
        )
    action = operations.pause_schedule if args.action == "pause" else operations.resume_schedule
    with connecting.connect(args) as conn:
        existing.require_flow(conn, args.flow_slug)
        _require_schedule(conn, args.flow_slug, args.name)
        row = connecting.perform(conn, action(args.flow_slug, args.name))
    if args.format == "json":
        print_json(row)
    elif args.action == "pause":
        print(f"paused schedule {args.name} of {args.flow_slug}: it starts no run until"
              f" `pgflow-gen schedules resume {args.flow_slug} {args.name}`")  # fmt: skip
    else:
        print(f"resumed schedule {args.name} of {args.flow_slug}: its next run is at"
              f" {_in_zone(_next(row), row['timezone'])}")  # fmt: skip
    return EXIT_OK


def _require_schedule(conn: psycopg.Connection[dict[str, Any]], flow_slug: str, name: str) -> None:
    known = [
        r["schedule_name"] for r in conn.execute(operator_statements.SCHEDULE_NAMES, (flow_slug,))
    ]
    existing.require_member(flow_slug, "schedule", name, known)


def _next(row: dict[str, Any]) -> datetime.datetime | None:
    """The schedule's next slot after now (None: paused, or a cron this release cannot read)."""
    if row["paused_at"] is not None:
        return None
    rule = schedule_rules.Schedule(
        row["flow_slug"], row["schedule_name"], row["cron"], row["timezone"], row["catch_up"]
    )
    try:
        return schedule_rules.next_slot(rule, datetime.datetime.now(datetime.UTC))
    except (ValueError, KeyError):
        return None


def _in_zone(when: datetime.datetime | None, timezone: str) -> str | None:
    """A slot as the schedule's cron reads it: in its time zone, named ("2026-12-06 03:00
    Europe/Paris"; seconds only when the slot has some).

    >>> _in_zone(datetime.datetime(2026, 12, 6, 2, 0, tzinfo=datetime.UTC), "Europe/Paris")
    '2026-12-06 03:00 Europe/Paris'
    """
    if when is None:
        return None
    try:
        local = when.astimezone(zoneinfo.ZoneInfo(timezone))
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):  # a zone this machine does not know
        return cell(when)
    shape = "%Y-%m-%d %H:%M:%S" if local.second else "%Y-%m-%d %H:%M"
    return f"{local.strftime(shape)} {timezone}"


def _list(args: argparse.Namespace) -> int:
    with connecting.connect(args) as conn:
        if args.only_flow is not None:
            existing.require_flow(conn, args.only_flow)
        rows = conn.execute(
            operator_statements.SCHEDULES, (args.only_flow, args.only_flow)
        ).fetchall()
    for row in rows:
        row["next_run_at"] = _next(row)
    if args.format == "json":
        print_json({"schedules": [
            {key: row[key] for key in (
                "flow_slug", "schedule_name", "cron", "timezone", "catch_up", "input",
                "paused_at", "next_run_at", "last_slot_at", "last_run_id", "last_run_status")}
            for row in rows
        ]})  # fmt: skip
        return EXIT_OK
    if not rows:
        print("no schedule" + (f" in {args.only_flow}" if args.only_flow else ""))
        return EXIT_OK
    table(
        [
            (r["flow_slug"], r["schedule_name"], r["cron"], r["timezone"], r["catch_up"],
             "paused" if r["paused_at"] else _in_zone(r["next_run_at"], r["timezone"]),
             cell(r["last_slot_at"]),
             None if r["last_run_id"] is None else f"{r['last_run_id']} ({r['last_run_status']})")
            for r in rows
        ],
        ["flow", "schedule", "cron", "time zone", "catch up", "next run", "last slot", "last run"],
        sys.stdout,
    )  # fmt: skip
    return EXIT_OK

"""`pgflow-gen limits`: show the steps' limits and their use, or change a step's limits live.

The engine enforces a step's limits when tasks are claimed, across every worker (engine 0017):
`--max-in-flight N` tasks started at once, and `--rate COUNT/PERIOD` task starts in any window
of PERIOD. A flow's spec sets them too (`options: {max_in_flight, rate_limit}`): they are each
step's baseline. Limits set here override the spec's, through worker starts and migrations,
until `--reset` gives the step back the spec's (engine 0023). docs/flow-control.md has worked
examples.
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
from typing import Any

from pgflow_gen.cli import connecting, existing, runs, step_controls
from pgflow_gen.cli import parser as cli_parser
from pgflow_gen.cli.control import require_step
from pgflow_gen.cli.exits import EXIT_OK
from pgflow_gen.cli.output import print_json, table
from pgflow_gen.errors import UsageError
from pgflow_gen.runtime import client as client_module
from pgflow_gen.runtime.client import operations

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: What an option takes to clear its limit.
NONE = "none"


def cap(text: str) -> int | None:
    """`--max-in-flight`: a whole number from 1, or `none` (argparse type).

    >>> cap("4"), cap("none")
    (4, None)
    """
    if text.strip().lower() == NONE:
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(
            f"invalid cap {text!r}: write a whole number from 1, or none to clear it"
        )
    return int(text)


def rate(text: str) -> tuple[int, int] | None:
    """`--rate`: COUNT/PERIOD as (count, seconds), such as `100/60s`, `100/1m`, `5/s` or
    `100/60` (seconds); `none` clears it (argparse type).

    >>> rate("100/1m"), rate("5/s"), rate("30/90"), rate("none")
    ((100, 60), (5, 1), (30, 90), None)
    """
    if text.strip().lower() == NONE:
        return None
    found = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)?\s*([smhd])?\s*", text)
    if found is None or (found[2] is None and found[3] is None):
        raise argparse.ArgumentTypeError(
            f"invalid rate {text!r}: write COUNT/PERIOD, for example 100/1m, 10/s or 500/3600s,"
            " or none to clear it"
        )
    count = int(found[1])
    period = int(found[2] or 1) * _UNITS[found[3] or "s"]
    if count < 1 or period < 1:
        raise argparse.ArgumentTypeError(
            f"invalid rate {text!r}: the count and the period must be at least 1"
        )
    return count, period


def register(commands: cli_parser.Commands) -> None:
    """Add `limits` to the `pgflow-gen` parser."""
    limits = commands.add(
        "limits",
        "show the steps' limits and their use, or change a step's limits for every worker",
        database=True,
        formats=runs.FORMATS,
    )
    limits.add_argument("flow_slug", metavar="FLOW", nargs="?", help="only this flow")
    limits.add_argument("step_slug", metavar="STEP", nargs="?", help="only this step")
    limits.add_argument(
        "--max-in-flight",
        type=cap,
        default=argparse.SUPPRESS,
        metavar="N",
        help="at most N of the step's tasks started at once (none: no cap)",
    )
    limits.add_argument(
        "--rate",
        type=rate,
        default=argparse.SUPPRESS,
        metavar="COUNT/PERIOD",
        help="at most COUNT task starts in any PERIOD, such as 100/1m or 10/s (none: no rate"
        " limit); every attempt and every map element is a start",
    )
    limits.add_argument(
        "--clear",
        action="store_true",
        help="remove the step's limits (over limits its spec sets: until --reset)",
    )
    limits.add_argument(
        "--reset",
        action="store_true",
        help="remove what an operator set: the step gets the limits its flow's spec sets",
    )
    limits.set_defaults(handler=_limits)


def _limits(args: argparse.Namespace) -> int:
    setting = args.clear or "max_in_flight" in args or "rate" in args
    if not setting and not args.reset:
        return _show(args)
    if args.flow_slug is None or args.step_slug is None:
        raise UsageError(
            "Name the flow and the step whose limits change.",
            hint="For example `pgflow-gen limits enrichContacts lookup --max-in-flight 4"
            " --rate 100/1m`.",
        )
    if args.clear and ("max_in_flight" in args or "rate" in args):
        raise UsageError("--clear removes every limit: give it alone, or change the limits.")
    if args.reset and setting:
        raise UsageError(
            "--reset gives the step the spec's limits: give it alone, or set limits.",
            hint="Set limits with --max-in-flight, --rate or --clear; --reset undoes them.",
        )
    with connecting.connect(args) as conn:
        require_step(conn, args.flow_slug, args.step_slug)
        before = step_controls.step_limits(conn).get((args.flow_slug, args.step_slug))
        if args.reset:
            action = operations.reset_step_limits(args.flow_slug, args.step_slug)
        else:
            wanted = _merged(args, before)
            action = operations.set_step_limits(args.flow_slug, args.step_slug, *wanted)
        connecting.perform(conn, action)
        after = step_controls.step_limits(conn).get((args.flow_slug, args.step_slug))
    if args.format == "json":
        print_json({"flow_slug": args.flow_slug, "step_slug": args.step_slug,
                    "limits": step_controls.limits_json(after)})  # fmt: skip
        return EXIT_OK
    where = f"step {args.step_slug} of {args.flow_slug}"
    print(f"{where}: {_describe(after)}" if after else f"{where}: no limits now")
    if args.reset:
        if before is None or before.get("overridden_at") is None:
            print("note: no operator's limits to remove: these are the spec's", file=sys.stderr)
    elif after is not None and client_module.overrides_spec(after):
        print(
            "note: an operator's limits stay through worker starts and `pgflow-gen db apply`;"
            f" `pgflow-gen limits {args.flow_slug} {args.step_slug} --reset` gives the step the"
            " spec's again",
            file=sys.stderr,
        )
    return EXIT_OK


def _merged(args: argparse.Namespace, before: dict[str, Any] | None) -> tuple[Any, Any, Any]:
    """(max_in_flight, rate_limit, rate_period_s): what the options say, the rest as it was."""
    if args.clear:
        return None, None, None
    max_in_flight = before["max_in_flight"] if before else None
    count, period = (before["rate_limit"], before["rate_period_s"]) if before else (None, None)
    if "max_in_flight" in args:
        max_in_flight = args.max_in_flight
    if "rate" in args:
        count, period = args.rate if args.rate is not None else (None, None)
    return max_in_flight, count, period


def _describe(limits: dict[str, Any]) -> str:
    """A step's limits in words, with their use: "at most 4 in flight (3 now), ...; set by the
    spec", or over the spec's "...; an operator's, set by ada on ...; the spec says ..."."""
    parts = []
    if limits["max_in_flight"] is not None:
        parts.append(f"at most {limits['max_in_flight']} in flight ({limits['in_flight']} now)")
    if limits["rate_limit"] is not None:
        parts.append(
            f"at most {limits['rate_limit']} starts per {limits['rate_period_s']} s"
            f" ({limits['window_starts']} in the last {limits['rate_period_s']} s)"
        )
    if limits.get("limit_per_key") is not None:
        parts.append(_per_key(limits))
    words = ", ".join(parts) or "no limits"
    if client_module.overrides_spec(limits):
        return f"{words}; {client_module.override_in_words(limits)}"
    return f"{words}; set by the {limits['set_by']}"


def _per_key(limits: dict[str, Any]) -> str:
    """A keyed step's limit per key and its use: "at most 2 per $.tenant (1 key waiting)"."""
    return (
        f"at most {limits['limit_per_key']} per {limits['key_path']}"
        f" ({limits['keys_waiting']} key{'' if limits['keys_waiting'] == 1 else 's'} waiting)"
    )


def _show(args: argparse.Namespace) -> int:
    with connecting.connect(args) as conn:
        if args.flow_slug is not None and args.step_slug is not None:
            require_step(conn, args.flow_slug, args.step_slug)
        elif args.flow_slug is not None:
            existing.require_flow(conn, args.flow_slug)
        rows = [
            limits
            for (flow_slug, step_slug), limits in step_controls.step_limits(conn).items()
            if args.flow_slug in (None, flow_slug) and args.step_slug in (None, step_slug)
        ]
    if args.format == "json":
        print_json({"steps": [
            {"flow_slug": r["flow_slug"], "step_slug": r["step_slug"],
             "queue_name": r["queue_name"], "limits": step_controls.limits_json(r)}
            for r in rows
        ]})  # fmt: skip
        return EXIT_OK
    if not rows:
        print("no step has limits" + (f" in {args.flow_slug}" if args.flow_slug else ""))
        return EXIT_OK
    # The spec's limits show beside an operator's, when some step has an operator's.
    overridden = any(client_module.overrides_spec(r) for r in rows)
    table(
        [
            (r["flow_slug"], r["step_slug"], r["queue_name"], r["max_in_flight"], r["in_flight"],
             None if r["rate_limit"] is None else f"{r['rate_limit']}/{r['rate_period_s']} s",
             None if r["rate_limit"] is None else r["window_starts"],
             None if r.get("limit_per_key") is None else _per_key(r), _set_by(r),
             *([_spec(r)] if overridden else []))
            for r in rows
        ],
        ["flow", "step", "queue", "max in flight", "in flight", "rate", "starts in window",
         "per key", "set by", *(["spec says"] if overridden else [])],
        sys.stdout,
    )  # fmt: skip
    return EXIT_OK


def _set_by(limits: dict[str, Any]) -> str:
    """ "spec", or "operator (ada, 2026-12-05 10:02 UTC)" for an operator's override."""
    if not client_module.overrides_spec(limits):
        return str(limits["set_by"])
    at = limits["overridden_at"].astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"operator ({limits['overridden_by']}, {at})"


def _spec(limits: dict[str, Any]) -> str | None:
    """What the spec says under an operator's limits (None: no operator's)."""
    if not client_module.overrides_spec(limits):
        return None
    return client_module.spec_limits_in_words(limits)

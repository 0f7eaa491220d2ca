"""`pgflow-gen start FLOW --inputs FILE`: one run per line of a JSON Lines file, started in
chunks with `pgflow.start_flows` (engine 0014), with a progress display on a terminal.

Every line is read and checked against the flow's input schema before anything starts; bad
lines are listed with their numbers (exit 2). Each chunk is one transaction: when one fails, the
chunks before it have started, and the message says which lines did and how to start the rest
(`--skip`). With `--key-prefix P` each run gets the idempotency key `P:<line number>`, so the
same file started again starts only what is missing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import psycopg
from psycopg.types.json import Jsonb

from pgflow_gen.cli.exits import EXIT_OK
from pgflow_gen.cli.output import print_json
from pgflow_gen.engine import operator_statements, refusals, statements, support
from pgflow_gen.errors import UsageError
from pgflow_gen.runtime import errors, input_examples, inputs
from pgflow_gen.runtime.client import run_calls
from pgflow_gen.words import counted

#: Runs per start_flows call (one transaction each).
DEFAULT_CHUNK = 1000
#: The most bad lines an error lists.
LISTED_PROBLEMS = 10


@dataclass(frozen=True)
class Line:
    """A line of the file that holds a run input: its number (from 1) and its value."""

    number: int
    value: Any


class BulkStartError(errors.PgflowError):
    """A chunk of runs could not be started; the chunks before it were."""

    code = "bulk_start_failed"


def add_arguments(start: argparse.ArgumentParser) -> None:
    """The options of `start` for many runs at once."""
    start.add_argument(
        "--inputs",
        metavar="FILE",
        help="start one run per line of this JSON Lines file (- for standard input) instead of"
        " one run with --input",
    )
    start.add_argument(
        "--key-prefix",
        metavar="P",
        help="give each run of --inputs the idempotency key P:<line number>, so that starting"
        " the file again starts only the runs not started yet",
    )
    start.add_argument(
        "--skip",
        type=int,
        default=0,
        metavar="N",
        help="start no run for the first N lines of --inputs (to resume after a failure)",
    )
    start.add_argument(
        "--chunk",
        type=int,
        default=DEFAULT_CHUNK,
        metavar="N",
        help="runs of --inputs started per call and transaction",
    )


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse options that do not go with --inputs, or the other way round."""
    if args.inputs is None:
        for name, value in (("--key-prefix", args.key_prefix), ("--skip", args.skip)):
            if value:
                raise UsageError(f"{name} goes with --inputs FILE.")
        return
    for name, given in (
        ("--input", args.input != "{}"),
        ("--key", args.key is not None),
        ("--wait", args.wait),
    ):
        if given:
            raise UsageError(
                f"{name} starts one run; --inputs starts one per line of a file.",
                hint="Give either --inputs FILE or --input JSON.",
            )
    if args.chunk < 1 or args.skip < 0:
        raise UsageError("--chunk must be at least 1 and --skip at least 0.")


def start_many(args: argparse.Namespace, conn: psycopg.Connection[dict[str, Any]]) -> int:
    """Start the runs of `args.inputs` (the flow exists); print what started."""
    if args.priority and not statements.has_priority(support.version(conn)):
        raise run_calls.priority_unsupported()
    schema_row = conn.execute(statements.FLOW_INPUT_SCHEMA, (args.flow_slug,)).fetchone()
    schema = None if schema_row is None else schema_row["schema"]
    lines = read_lines(args.inputs, input_examples.example_text(schema))
    check_lines(args.flow_slug, schema, lines, args.inputs)
    todo = [line for line in lines if line.number > args.skip]
    progress = Progress(args.flow_slug, len(todo), sys.stderr)
    started: list[dict[str, Any]] = []
    for chunk in chunks(todo, args.chunk):
        keys = None if args.key_prefix is None else [f"{args.key_prefix}:{x.number}" for x in chunk]
        values = [Jsonb(x.value) for x in chunk]
        try:
            if args.priority:
                rows = conn.execute(
                    operator_statements.START_FLOWS_CREATED_WITH_PRIORITY,
                    (args.flow_slug, values, keys, args.priority),
                ).fetchall()
            else:
                rows = conn.execute(
                    operator_statements.START_FLOWS_CREATED, (args.flow_slug, values, keys)
                ).fetchall()
        except psycopg.Error as exc:
            progress.end()
            raise _failed(args, chunk[0].number, started, refusals.engine_error(exc)) from exc
        for line, row in zip(chunk, rows, strict=True):
            started.append({"line": line.number, **row})
        progress.advance(len(chunk))
    progress.end()
    created = sum(1 for run in started if run["created"])
    if args.format == "json":
        print_json({
            "flow_slug": args.flow_slug,
            "lines": len(lines),
            "skipped_lines": len(lines) - len(todo),
            "started": created,
            "existing": len(started) - created,
            "runs": started,
        })  # fmt: skip
        return EXIT_OK
    said = (
        f"started {counted(created, 'run')} of {args.flow_slug} from {counted(len(todo), 'line')}"
    )
    if len(started) > created:
        said += f"; {len(started) - created:,} had their key already and did not start again"
    if args.skip:
        said += f" (skipped the first {counted(args.skip, 'line')})"
    print(f"{said} in {progress.elapsed():.1f} s")
    return EXIT_OK


def read_lines(source: str, example: str | None = None) -> list[Line]:
    """The run inputs of a JSON Lines file (blank lines skipped); bad JSON is a usage error
    that lists the lines (and shows `example`, an input of the flow, when there is one)."""
    if source == "-":
        return _parse(sys.stdin, "standard input", example)
    path = Path(source)
    with path.open(encoding="utf-8") as stream:
        return _parse(stream, str(path), example)


def _parse(stream: TextIO, name: str, example: str | None) -> list[Line]:
    lines: list[Line] = []
    problems: list[str] = []
    for number, text in enumerate(stream, start=1):
        if not text.strip():
            continue
        try:
            lines.append(Line(number, json.loads(text)))
        except json.JSONDecodeError as exc:
            problems.append(f"line {number}: {exc.msg} (column {exc.colno})")
    if problems:
        raise UsageError(
            f"{name}: {counted(len(problems), 'line')}"
            f" {'is' if len(problems) == 1 else 'are'} not JSON; nothing was started.",
            detail=_listed(problems),
            hint=f"Each line holds one run input, such as {example}."
            if example
            else "Each line holds one run input: one JSON value.",
        )
    if not lines:
        raise UsageError(f"{name} holds no run input; nothing was started.")
    return lines


def check_lines(flow_slug: str, schema: Any, lines: list[Line], name: str) -> None:
    """Check every line against the flow's stored input schema (none stored: nothing to check)."""
    if schema is None:
        return
    problems = []
    for line in lines:
        try:
            inputs.check(flow_slug, schema, line.value)
        except errors.InvalidRunInputError as exc:
            problems.append(f"line {line.number}: {exc.message}")
    if problems:
        raise UsageError(
            f"{name}: {len(problems)} of {counted(len(lines), 'input')}"
            f" {'does' if len(problems) == 1 else 'do'} not fit flow {flow_slug};"
            " nothing was started.",
            detail=_listed(problems),
            hint="`pgflow-gen flows` shows the flow's input schema.",
        )


def _listed(problems: list[str]) -> str:
    shown = problems[:LISTED_PROBLEMS]
    more = len(problems) - len(shown)
    return "\n".join(shown) + (f"\n... and {more} more" if more else "")


def chunks(lines: list[Line], size: int) -> Iterator[list[Line]]:
    for start in range(0, len(lines), size):
        yield lines[start : start + size]


def _failed(
    args: argparse.Namespace, first: int, started: Iterable[dict[str, Any]], exc: Exception
) -> BulkStartError:
    done = [run["line"] for run in started]
    source = "-" if args.inputs == "-" else args.inputs
    resume = f"pgflow-gen start {args.flow_slug} --inputs {source} --skip {first - 1}" + (
        f" --key-prefix {args.key_prefix}" if args.key_prefix else ""
    )
    return BulkStartError(
        f"Starting runs of {args.flow_slug} failed at line {first}: {exc}",
        detail=(
            f"The runs of lines up to {done[-1]} started ({counted(len(done), 'run')});"
            f" none of line {first} on did."
            if done
            else "No run was started."
        ),
        hint=f"Start the rest with `{resume}`.",
    )


class Progress:
    """`started 4,000/10,000 runs of F (40 %), 3,200/s` on a terminal, rewritten in place;
    nothing otherwise (the summary line says it all)."""

    def __init__(self, flow_slug: str, total: int, out: TextIO) -> None:
        self.flow_slug = flow_slug
        self.total = total
        self.out = out
        self.shown = out.isatty()
        self.done = 0
        self.began = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    def advance(self, count: int) -> None:
        self.done += count
        if not self.shown:
            return
        rate = self.done / max(self.elapsed(), 1e-6)
        self.out.write(
            f"\rstarted {self.done:,}/{self.total:,} runs of {self.flow_slug}"
            f" ({100 * self.done / self.total:.0f} %), {rate:,.0f}/s"
        )
        self.out.flush()

    def end(self) -> None:
        if self.shown and self.done:
            self.out.write("\n")
            self.out.flush()

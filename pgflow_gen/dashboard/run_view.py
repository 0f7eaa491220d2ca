"""The run page's data: the run, each step's state with its tasks and last error, the DAG laid
out for drawing, and the run's timeline (events are sent, not stored, so it is rebuilt from the
engine's timestamps, the signals and the operators' actions)."""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from pgflow_gen import run_ids
from pgflow_gen.dashboard import dag
from pgflow_gen.engine import dashboard_statements, statements, support

Connection = psycopg.AsyncConnection[dict[str, Any]]

ACTIVE = "started"


@dataclass(frozen=True)
class StepView:
    step_slug: str
    step_index: int
    step_type: str
    queue_name: str
    dependencies: tuple[str, ...]
    status: str | None
    max_attempts: int
    timeout: int
    attempts: int | None
    tasks: int
    queued: int
    running: int
    done: int
    failed: int
    created_at: datetime.datetime | None
    started_at: datetime.datetime | None
    completed_at: datetime.datetime | None
    failed_at: datetime.datetime | None
    skipped_at: datetime.datetime | None
    skip_reason: str | None
    step_error: str | None
    output_head: str | None
    output_length: int | None
    error_task: int | None
    error_message: str | None
    error_at: datetime.datetime | None
    required_input_pattern: Any = None
    forbidden_input_pattern: Any = None
    when_unmet: str = "skip"
    paused: bool = False
    #: Whether the run is still started: a step of a finished run waits for nothing.
    run_active: bool = True
    #: A subflow step's flow (engine 0028): its tasks are runs of that flow.
    subflow_slug: str | None = None

    @property
    def kind(self) -> str:
        """What runs the step's tasks, for its box: a worker's handler ("task"), nothing (a
        "signal" step) or runs of another flow ("subflow")."""
        if self.subflow_slug is not None:
            return "subflow"
        return "signal" if self.step_type == "signal" else "task"

    @property
    def waiting_for_signal(self) -> bool:
        return self.run_active and self.step_type == "signal" and self.status == "started"

    @property
    def state(self) -> str:
        """The state that colours the step (a CSS class suffix)."""
        if self.waiting_for_signal:
            return "waiting"
        return self.status or "created"

    @property
    def ended_at(self) -> datetime.datetime | None:
        return self.completed_at or self.failed_at or self.skipped_at

    @property
    def output_truncated(self) -> bool:
        return self.output_length is not None and self.output_length > len(self.output_head or "")

    @property
    def condition(self) -> str | None:
        """The step's condition as its spec writes it (`if:`, `if_not:`), and what happens when
        it is unmet unless that is the usual skip."""
        parts = [
            f"{name}: {json.dumps(pattern, separators=(',', ':'), sort_keys=True)}"
            for name, pattern in (
                ("if", self.required_input_pattern),
                ("if_not", self.forbidden_input_pattern),
            )
            if pattern is not None
        ]
        if parts and self.when_unmet != "skip":
            parts.append(f"when_unmet: {self.when_unmet}")
        return ", ".join(parts) or None

    @property
    def caption(self) -> str:
        if self.waiting_for_signal:
            return "waiting for a signal"
        words = [self.status or "created"]
        unit = "runs" if self.subflow_slug is not None else "tasks"
        if self.step_type == "map":  # how many elements it maps, once it knows
            known = self.tasks or self.status == "completed"
            words.append(f"{self.done}/{self.tasks} {unit}" if known else "map")
        if self.subflow_slug is not None:
            words.append(f"runs {self.subflow_slug}")
        if self.attempts and self.attempts > 1:
            words.append(f"{self.attempts} attempts")
        if self.paused and self.status in (None, "created", "started"):
            words.append("paused")
        return ", ".join(words)


@dataclass(frozen=True)
class Event:
    at: datetime.datetime
    what: str
    step_slug: str | None = None
    detail: str | None = None


@dataclass(frozen=True)
class RunDetail:
    run: dict[str, Any]
    steps: list[StepView]
    graph: dag.Graph
    events: list[Event]
    pauses: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The run's subflow runs (engine 0028), each with the step and task that started it.
    children: list[dict[str, Any]] = field(default_factory=list)

    def children_of(self, step_slug: str) -> list[dict[str, Any]]:
        """The subflow runs a step started, in task order."""
        return [child for child in self.children if child["parent_step_slug"] == step_slug]

    @property
    def active(self) -> bool:
        return bool(self.run["status"] == ACTIVE)

    @property
    def waiting_signals(self) -> list[str]:
        return [step.step_slug for step in self.steps if step.waiting_for_signal]

    @property
    def failure(self) -> Failure | None:
        """Why a failed run failed: its first failed step and that step's error's first line."""
        if self.run["status"] != "failed":
            return None
        failed = sorted(
            (step for step in self.steps if step.status == "failed"),
            key=lambda step: (step.failed_at is None, step.failed_at or self.run["failed_at"]),
        )
        if not failed:
            return None
        step = failed[0]
        task = step.error_task if step.tasks > 1 and step.error_message else None
        return Failure(step.step_slug, task, _first_line(step.error_message or step.step_error))

    @property
    def short_id(self) -> str:
        """The run id as short as `pgflow-gen` commands take it."""
        return run_ids.short(self.run["run_id"])

    @property
    def input_truncated(self) -> bool:
        length = self.run.get("input_length")
        return length is not None and length > len(self.run.get("input_head") or "")


@dataclass(frozen=True)
class Failure:
    step_slug: str
    task_index: int | None  # which task of a map step, when it has several
    error: str | None  # the first line of its error


async def run_detail(conn: Connection, run_id: uuid.UUID) -> RunDetail | None:
    """The run, its steps and its timeline; None when there is no such run."""
    version = await support.version_async(conn)
    summary = dashboard_statements.run_summary(version)
    run = await (await conn.execute(summary, (run_id,))).fetchone()
    if run is None:
        return None
    pauses = {
        row["step_slug"]: row
        for row in await (
            await conn.execute(dashboard_statements.FLOW_PAUSES, (run["flow_slug"],))
        ).fetchall()
    }
    details = await conn.execute(dashboard_statements.run_step_details(version), (run_id,))
    steps = [
        StepView(**{**row, "dependencies": tuple(row["dependencies"])},
                 paused=row["step_slug"] in pauses, run_active=run["status"] == ACTIVE)
        for row in await details.fetchall()
    ]  # fmt: skip
    signals = await (await conn.execute(dashboard_statements.RUN_SIGNALS, (run_id,))).fetchall()
    children: list[dict[str, Any]] = []
    if statements.has_subflows(version):
        tree = await conn.execute(statements.RUN_SUBFLOWS, (run_id,))
        children = [row for row in await tree.fetchall() if row["depth"] == 1]
    actions = await (await conn.execute(dashboard_statements.RUN_ACTIONS, (run_id,))).fetchall()
    graph = dag.layout(
        [
            dag.Box(s.step_slug, s.dependencies, s.state, s.caption, s.condition, s.kind)
            for s in steps
        ]
    )
    return RunDetail(
        run=run, steps=steps, graph=graph, events=timeline(run, steps, signals, actions),
        pauses=pauses, children=children,
    )  # fmt: skip


def timeline(
    run: dict[str, Any],
    steps: Sequence[StepView],
    signals: Sequence[dict[str, Any]],
    actions: Sequence[dict[str, Any]],
) -> list[Event]:
    """The run's events from the engine's timestamps (events are sent, not stored), the signals
    it received and the operators' actions on it, oldest first."""
    events = [Event(run["started_at"], "run started")]
    for step in steps:
        if step.started_at is not None:
            what = "waits for a signal" if step.step_type == "signal" else "started"
            events.append(Event(step.started_at, f"step {what}", step.step_slug))
        if step.completed_at is not None:
            events.append(Event(step.completed_at, "step completed", step.step_slug))
        if step.failed_at is not None:
            events.append(Event(step.failed_at, "step failed", step.step_slug,
                                _first_line(step.step_error or step.error_message)))  # fmt: skip
        if step.skipped_at is not None:
            events.append(Event(step.skipped_at, "step skipped", step.step_slug, step.skip_reason))
    for signal in signals:
        events.append(Event(signal["received_at"], "signal received", signal["step_slug"]))
    for action in actions:
        detail = f"by {action['actor']}"
        if action.get("label"):
            detail += f" ({action['label']})"
        if action["detail"]:
            detail += f": {action['detail']}"
        events.append(Event(action["acted_at"], f"{action['action']} (operator)",
                            action["step_slug"], detail))  # fmt: skip
    if run["retried_at"] is not None:
        events.append(Event(run["retried_at"], f"run retried (retry {run['retry_count']})"))
    for column, what in (("completed_at", "completed"), ("failed_at", "failed"),
                         ("cancelled_at", "cancelled")):  # fmt: skip
        if run[column] is not None:
            reason = run["cancel_reason"] if column == "cancelled_at" else None
            events.append(Event(run[column], f"run {what}", None, reason))
    return sorted(events, key=lambda event: event.at)


async def run_input(conn: Connection, run_id: uuid.UUID) -> tuple[bool, Any]:
    """(whether the run exists, its whole input)."""
    row = await (await conn.execute(dashboard_statements.WHOLE_RUN_INPUT, (run_id,))).fetchone()
    return (False, None) if row is None else (True, row["input"])


async def step_output(conn: Connection, run_id: uuid.UUID, step_slug: str) -> Any:
    row = await (
        await conn.execute(dashboard_statements.STEP_OUTPUT, (run_id, step_slug))
    ).fetchone()
    return None if row is None else row["output"]


def _first_line(text: str | None) -> str | None:
    return text.strip().splitlines()[0] if text and text.strip() else None

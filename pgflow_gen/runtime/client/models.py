"""What client calls return: runs' records, their failures, waiting signals and unserved steps,
step pauses and limits (with the limits in words, as `limits` and `status` print them)."""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, Literal, TypeVar

from pgflow_gen.words import counted

OutputT = TypeVar("OutputT")

RunStatus = Literal["started", "completed", "failed", "cancelled"]


@dataclass(frozen=True)
class StepPause:
    """A paused step (`Client.pause_step`): no task of it starts until it is resumed."""

    flow_slug: str
    step_slug: str
    reason: str | None
    paused_at: datetime.datetime


@dataclass(frozen=True)
class StepLimits:
    """A step's limits (`Client.set_step_limits`, engine 0017) and their use now: tasks started
    against `max_in_flight`, task starts in the last `rate_period_s` seconds against
    `rate_limit`. None: no such limit. `set_by` is "spec" or "operator": an operator's limits
    override the spec's (`spec_*`) from `overridden_at` until `Client.reset_step_limits`
    (engine 0023)."""

    flow_slug: str
    step_slug: str
    queue_name: str
    max_in_flight: int | None
    rate_limit: int | None
    rate_period_s: int | None
    set_by: str
    in_flight: int
    window_starts: int
    updated_at: datetime.datetime
    spec_max_in_flight: int | None = None
    spec_rate_limit: int | None = None
    spec_rate_period_s: int | None = None
    overridden_at: datetime.datetime | None = None
    overridden_by: str | None = None

    @property
    def in_words(self) -> str:
        """ "3/4 in flight, 42/100 starts per 60 s"."""
        return limits_in_words(dataclasses.asdict(self))


def limits_in_words(limits: Mapping[str, Any]) -> str:
    """A step's limits and their use (step_limit_usage's columns) in a few words, as the CLI,
    the dashboard and `StepLimits.in_words` say them.

    >>> limits_in_words({"max_in_flight": 4, "in_flight": 3, "rate_limit": 100,
    ...                  "rate_period_s": 60, "window_starts": 42})
    '3/4 in flight, 42/100 starts per 60 s'

    An operator's limits over the spec's say so in brackets, and what the spec says under them
    (`override_in_words`).
    """
    parts = []
    if limits["max_in_flight"] is not None:
        parts.append(f"{limits['in_flight']}/{limits['max_in_flight']} in flight")
    if limits["rate_limit"] is not None:
        parts.append(
            f"{limits['window_starts']}/{limits['rate_limit']} starts per"
            f" {limits['rate_period_s']} s"
        )
    if limits.get("limit_per_key") is not None:
        waiting = limits["keys_waiting"]
        parts.append(
            f"{limits['limit_per_key']} per {limits['key_path']}:"
            f" {counted(limits['keys_active'], 'key')} in flight, {waiting} waiting"
            + (
                f" ({counted(limits['parked'], 'task')}, most for {limits['busiest_key']!r})"
                if waiting
                else ""
            )
        )
    words = ", ".join(parts)
    if not overrides_spec(limits):
        return words
    return f"{words or 'no limits'} ({override_in_words(limits)})"


def overrides_spec(limits: Mapping[str, Any]) -> bool:
    """Whether an operator's limits stand over limits the step's spec sets (engine 0023). An
    operator's limits on a step the spec does not limit override nothing: they are the
    step's limits, "set by the operator", as before."""
    return limits.get("overridden_at") is not None and (
        limits.get("spec_max_in_flight") is not None or limits.get("spec_rate_limit") is not None
    )


def override_in_words(limits: Mapping[str, Any]) -> str:
    """Whose limits a step's are when an operator overrides the spec's, and what the spec says.

    >>> override_in_words({"overridden_at": datetime.datetime(2026, 12, 5, 10, 2,
    ...                    tzinfo=datetime.UTC), "overridden_by": "ada", "spec_max_in_flight": 3})
    "an operator's, set by ada on 2026-12-05 10:02 UTC; the spec says at most 3 in flight"
    """
    at = limits["overridden_at"].astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"an operator's, set by {limits['overridden_by']} on {at};"
        f" the spec says {spec_limits_in_words(limits)}"
    )


def spec_limits_in_words(limits: Mapping[str, Any]) -> str:
    """The limits a step's spec sets, under an operator's: "at most 3 in flight, 100 starts per
    60 s" ("none": the spec sets none)."""
    parts = []
    if limits.get("spec_max_in_flight") is not None:
        parts.append(f"at most {limits['spec_max_in_flight']} in flight")
    if limits.get("spec_rate_limit") is not None:
        parts.append(f"{limits['spec_rate_limit']} starts per {limits['spec_rate_period_s']} s")
    return ", ".join(parts) or "none"


#: What a step's limits hold when only its concurrency key limits it (engine 0018).
NO_STEP_LIMITS: Final[Mapping[str, Any]] = {
    "max_in_flight": None,
    "in_flight": 0,
    "rate_limit": None,
    "rate_period_s": None,
    "window_starts": 0,
    "set_by": "spec",
}
#: pgflow.concurrency_usage's columns that join a step's limits.
CONCURRENCY_FIELDS = ("key_path", "limit_per_key", "keys_active", "keys_waiting", "admitted",
                      "parked", "busiest_key", "busiest_parked")  # fmt: skip


def with_concurrency(
    limits: Mapping[tuple[str, str], Mapping[str, Any]], usage: Iterable[Mapping[str, Any]]
) -> dict[tuple[str, str], dict[str, Any]]:
    """Steps' limits by (flow, step), each keyed step's concurrency use
    (pgflow.concurrency_usage's rows) joined in: `limits_in_words` then says its keys too."""
    merged = {key: dict(value) for key, value in limits.items()}
    for row in usage:
        key = (row["flow_slug"], row["step_slug"])
        merged[key] = {
            **NO_STEP_LIMITS,
            "flow_slug": row["flow_slug"],
            "step_slug": row["step_slug"],
            "queue_name": row["queue_name"],
            **merged.get(key, {}),
            **{field: row[field] for field in CONCURRENCY_FIELDS},
        }
    return merged


@dataclass(frozen=True)
class StepFailure:
    """Why a run failed: its first failed step, and the failed task's attempts and error.

    `error` is what the engine stored: `Type: message` on its first line (`summary`), then the
    handler's traceback when there was one. A step failed without a task failure (a condition
    with `when_unmet: fail`, an output of the wrong type) has `task_index` None and 0 attempts.
    """

    step_slug: str
    task_index: int | None
    attempts: int
    error: str | None

    @property
    def summary(self) -> str:
        return (self.error or "no error message").split("\n", 1)[0]

    def describe(self) -> str:
        """One line: `step "greet" task 0, attempt 3: KeyError: 'name'`."""
        where = f'step "{self.step_slug}"'
        if self.task_index is not None:
            where += f" task {self.task_index}, attempt {self.attempts}"
        return f"{where}: {self.summary}"


@dataclass(frozen=True)
class SentSignal:
    """A signal the engine took (`Client.send_signal`): `used_at` is when its step took it as
    its output, None while the step is not ready yet (it takes it the moment it is)."""

    run_id: uuid.UUID
    step_slug: str
    payload: Any
    received_at: datetime.datetime
    used_at: datetime.datetime | None


@dataclass(frozen=True)
class RetriedRun:
    """A failed run the engine retried: `status` is `started` again, `retry_count` how often."""

    run_id: uuid.UUID
    flow_slug: str
    status: RunStatus
    retry_count: int


@dataclass(frozen=True)
class ForkedRun:
    """A new run the engine forked from a run at a step (engine 0029): `status` is `started`
    (or already finished, when nothing was left to run)."""

    run_id: uuid.UUID
    flow_slug: str
    status: RunStatus
    forked_from_run_id: uuid.UUID
    forked_from_step: str


@dataclass(frozen=True)
class PendingStart:
    """A burst of debounced starts (`Client.debounce_start`, engine 0030): its run starts at
    `start_at` with `input` (the last start's), unless another start with the key comes first
    and moves it (never past `deadline_at`, when the burst has one). `starts`: how many starts
    the burst holds."""

    flow_slug: str
    debounce_key: str
    input: Any
    starts: int
    first_at: datetime.datetime
    last_at: datetime.datetime
    start_at: datetime.datetime
    deadline_at: datetime.datetime | None


@dataclass(frozen=True)
class WaitingSignal:
    """A signal step of a run that waits for its signal now; `deadline` None: for ever."""

    step_slug: str
    waiting_since: datetime.datetime
    deadline: datetime.datetime | None


@dataclass(frozen=True)
class UnservedStep:
    """A step of a run with queued tasks and no live worker on its queue."""

    step_slug: str
    queue_name: str
    queued_tasks: int


@dataclass(frozen=True)
class RunRecord(Generic[OutputT]):
    """A run as last read from the database: what `Run` (from `Client`) and `AsyncRun` (from
    `AsyncClient`) both hold."""

    run_id: uuid.UUID
    flow_slug: str
    status: RunStatus
    input: Any
    output: OutputT | None
    started_at: datetime.datetime
    completed_at: datetime.datetime | None
    failed_at: datetime.datetime | None
    #: For a cancelled run: when, and the reason given (None when none was).
    cancelled_at: datetime.datetime | None = None
    cancel_reason: str | None = None
    #: The key it was started with (`start_flow(..., idempotency_key=...)`), if any.
    idempotency_key: str | None = None
    #: How often it was retried (`retry_run`), and when last.
    retry_count: int = 0
    retried_at: datetime.datetime | None = None
    #: For a subflow run (engine 0028): the run, the step and the task that started it.
    parent_run_id: uuid.UUID | None = None
    parent_step_slug: str | None = None
    parent_task_index: int | None = None
    #: For a forked run (engine 0029): the run and the step it was forked from.
    forked_from_run_id: uuid.UUID | None = None
    forked_from_step: str | None = None
    #: Its priority (`start_flow(..., priority=...)`, engine 0031; 0 before).
    priority: int = 0
    #: For a failed run: which step failed and why (None otherwise).
    failure: StepFailure | None = None

    @property
    def finished(self) -> bool:
        return self.status != "started"

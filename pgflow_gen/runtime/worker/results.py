"""Sending finished handlers' results to the engine: complete_task / fail_task, with runs of
successes batched into one complete_tasks call.

Every callback carries the attempt its claim started. The engine ignores a result of an attempt
that is no longer the task's current one (the task was retried or requeued and claimed again
since, say after this worker lost its connection for long); the worker logs each such stale
result once, and nothing else changes.

A result is never dropped because a statement failed: what the failure means is read from its
SQLSTATE (`sqlstate.classify`). Only a refusal (the data or the engine says no) changes a result:
a refused output fails its task with the reason, a refused error message is sent again made
storable. Every other failure raises with the unsent results kept, to be sent again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import psycopg

from pgflow_gen.runtime.reconnecting import primary_message
from pgflow_gen.runtime.sqlstate import Kind, classify
from pgflow_gen.runtime.worker.metrics import WorkerMetrics
from pgflow_gen.runtime.worker.session import Session, TaskRow
from pgflow_gen.runtime.worker.task_runner import MAX_ERROR_CHARS, Report

#: The error a failure report falls back to when the engine refuses its own error message.
UNSTORABLE_ERROR = "The engine refused the handler's error message"


async def send_reports(
    session: Session,
    reports: list[Report],
    log: logging.Logger,
    metrics: WorkerMetrics | None = None,
) -> None:
    """Send `reports` in order, removing each once the engine has it.

    Raises the psycopg error of a lost connection, a transient failure (a lock or statement
    timeout, a deadlock, a cancelled statement) or an unknown one, with the unsent reports kept
    in `reports`. A refused output fails its task instead; a refused error message is made
    storable; a task the engine no longer has is logged and its report dropped.
    """
    alone = 0  # reports to send one by one first, after a refused batch (it holds a bad one)
    while reports:
        if alone == 0:
            sent, refused = await _send_batch(session, reports, log, metrics)
            if sent:
                continue
            alone = refused
        alone = max(0, alone - 1)
        report = reports[0]
        try:
            if report.error is None:
                row = await session.complete_task(report.task, report.output)
            else:
                row = await session.fail_task(report.task, report.error, report.not_retried)
        except psycopg.Error as exc:
            if classify(session, exc) is not Kind.REFUSED:
                raise
            _replace(reports, report, primary_message(exc), exc, log)
            continue
        except (ValueError, TypeError, RecursionError) as exc:
            # The output could not even be encoded for the statement.
            _replace(reports, report, f"{type(exc).__name__}: {exc}", exc, log)
            continue
        log_if_stale(report, row, log, metrics)
        reports.pop(0)


def _replace(
    reports: list[Report], report: Report, reason: str, exc: Exception, log: logging.Logger
) -> None:
    """Put what to send instead of the refused `reports[0]` in its place, or drop it (logged)
    when the engine has no such task or refused every fallback."""
    instead = None if isinstance(exc, psycopg.errors.NoDataFound) else _refused(report, reason)
    if instead is None:
        _log_dropped(report, reason, log)
        reports.pop(0)
    else:
        reports[0] = instead


def _refused(report: Report, reason: str) -> Report | None:
    """What to send instead of a report the engine refused: a failure with the reason for an
    output; for a failure its error message made storable, then a fixed message; None when even
    the fixed message was refused."""
    task = report.task
    if report.error is None:
        return Report(task, error=f"The engine refused the handler's output: {reason}")
    storable = storable_text(report.error)
    if storable != report.error:
        return Report(task, error=storable, not_retried=report.not_retried)
    if not report.error.startswith(UNSTORABLE_ERROR):
        error = f"{UNSTORABLE_ERROR}: {storable_text(reason)}"
        return Report(task, error=error, not_retried=report.not_retried)
    return None


def storable_text(text: str) -> str:
    """`text` without what PostgreSQL's text cannot hold (NUL), at most MAX_ERROR_CHARS long."""
    return text.replace("\x00", "\\0")[:MAX_ERROR_CHARS]


async def _send_batch(
    session: Session, reports: list[Report], log: logging.Logger, metrics: WorkerMetrics | None
) -> tuple[bool, int]:
    """Complete the leading successes with one complete_tasks call (one statement, one round
    trip): (True, 0) when it did; (False, n) when there are fewer than two (n = 0) or the engine
    refused the batch of n.

    complete_tasks changes nothing when it fails, and a second complete_task for a completed
    task is a no-op, so after a refusal the n are simply sent again one by one, which isolates
    the bad one. Failures go one by one (the engine has no batch of them).
    """
    batch = leading_successes(reports)
    if len(batch) < 2:
        return False, 0
    try:
        rows = await session.complete_tasks([r.task for r in batch], [r.output for r in batch])
    except Exception as exc:
        if refused(session, exc):
            return False, len(batch)  # one by one finds the bad one
        raise
    settle(reports, batch, rows, log, metrics)
    return True, 0


def refused(session: Session, exc: Exception) -> bool:
    """Whether sending results failed because of the results themselves: the engine (or the
    data) refused them, or an output could not even be encoded. Sent one by one, each such
    report then gets what `send_reports` does with a refusal; any other failure keeps them."""
    if isinstance(exc, ValueError | TypeError | RecursionError):
        return True
    return isinstance(exc, psycopg.Error) and classify(session, exc) is Kind.REFUSED


def settle(
    reports: list[Report],
    batch: list[Report],
    rows: Sequence[TaskRow],
    log: logging.Logger,
    metrics: WorkerMetrics | None,
) -> None:
    """The engine took `batch`, the head of `reports` (a callback's `rows`, in order): remove
    them, and log each it ignored as stale."""
    del reports[: len(batch)]
    for report, row in zip(batch, rows, strict=True):
        log_if_stale(report, row, log, metrics)


def leading_successes(reports: list[Report]) -> list[Report]:
    """The successes at the head of `reports`, up to the first failure."""
    batch = []
    for report in reports:
        if report.error is not None:
            break
        batch.append(report)
    return batch


def _log_dropped(report: Report, reason: str, log: logging.Logger) -> None:
    task = report.task
    log.error(
        "dropped the %s of task %s/%s[%d] attempt %d: %s",
        "failure" if report.error is not None else "result",
        task.run_id,
        task.step_slug,
        task.task_index,
        task.attempt,
        reason,
    )


def log_if_stale(
    report: Report, row: TaskRow, log: logging.Logger, metrics: WorkerMetrics | None = None
) -> None:
    """Log (and count) a result the engine ignored because its attempt is no longer the task's
    current one (the callback returns the task's row, whose attempts_count then differs), or
    because its run was cancelled, or failed at another step, while the handler ran (the task's
    status is `cancelled`)."""
    if row is None:
        return
    task = report.task
    if metrics is not None and (row[0] != task.attempt or row[1] == "cancelled"):
        metrics.ignored(task.step_slug)
    if row[0] == task.attempt and row[1] == "cancelled":  # expected, hence no warning
        log.info(
            "ignored the %s of task %s/%s[%d] attempt %d: the task was cancelled (its run"
            " was cancelled, or failed at another step)",
            "failure" if report.error is not None else "result",
            task.run_id,
            task.step_slug,
            task.task_index,
            task.attempt,
        )
        return
    if row[0] == task.attempt:
        return
    log.warning(
        "ignored the %s of task %s/%s[%d] attempt %d: the task is on attempt %d (%s) since;"
        " a result of an earlier attempt changes nothing",
        "failure" if report.error is not None else "result",
        task.run_id,
        task.step_slug,
        task.task_index,
        task.attempt,
        row[0],
        row[1],
    )

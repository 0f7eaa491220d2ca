"""Sending finished handlers' results to the engine: complete_task / fail_task, with runs of
successes batched into one complete_tasks call.

Every callback carries the attempt its claim started. The engine ignores a result of an attempt
that is no longer the task's current one (the task was retried or requeued and claimed again
since, say after this worker lost its connection for long); the worker logs each such stale
result once, and nothing else changes."""

from __future__ import annotations

import logging

import psycopg

from pgflow_gen.runtime.links import connection_lost, primary_message
from pgflow_gen.runtime.session import Session, TaskRow
from pgflow_gen.runtime.task_runner import Report


async def send_reports(session: Session, reports: list[Report], log: logging.Logger) -> None:
    """Send `reports` in order, removing each once the engine has it.

    A lost connection raises and keeps the unsent ones (they are sent again after reconnecting).
    An output the engine refuses (too large, not storable) fails its task instead; any other
    refusal is logged and the report dropped, so one bad result never blocks the others.
    """
    while reports:
        if await _send_batch(session, reports, log):
            continue
        report = reports[0]
        task = report.task
        key = (task.run_id, task.step_slug, task.task_index)
        try:
            if report.error is None:
                row = await session.complete_task(task, report.output)
            else:
                row = await session.fail_task(task, report.error)
            _log_if_stale(report, row, log)
        except psycopg.Error as exc:
            if connection_lost(session, exc):
                raise
            if report.error is None and not isinstance(exc, psycopg.errors.NoDataFound):
                reports[0] = Report(
                    task, error=f"The engine refused the handler's output: {primary_message(exc)}"
                )
                continue
            log.error("could not report task %s/%s[%d]: %s", *key, primary_message(exc))
        reports.pop(0)


async def _send_batch(session: Session, reports: list[Report], log: logging.Logger) -> bool:
    """Complete the leading successes with one complete_tasks call (one statement, one round
    trip); False when there are fewer than two or the call failed.

    complete_tasks changes nothing when it fails, and a second complete_task for a completed
    task is a no-op, so after a failure they are simply sent again one by one, which isolates
    the bad one. Failures go one by one (the engine has no batch of them).
    """
    batch = []
    for report in reports:
        if report.error is not None:
            break
        batch.append(report)
    if len(batch) < 2:
        return False
    try:
        rows = await session.complete_tasks([r.task for r in batch], [r.output for r in batch])
    except psycopg.Error as exc:
        if connection_lost(session, exc):
            raise
        return False
    for report, row in zip(batch, rows, strict=True):
        _log_if_stale(report, row, log)
    del reports[: len(batch)]
    return True


def _log_if_stale(report: Report, row: TaskRow, log: logging.Logger) -> None:
    """Log a result the engine ignored because its attempt is no longer the task's current one
    (the callback returns the task's row, whose attempts_count then differs)."""
    if row is None or row[0] == report.task.attempt:
        return
    task = report.task
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

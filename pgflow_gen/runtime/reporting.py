"""Sending finished handlers' results to the engine: complete_task / fail_task, with runs of
successes batched into one complete_tasks call."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from pgflow_gen.runtime.links import connection_lost, primary_message
from pgflow_gen.runtime.task_runner import Report


async def send_reports(
    conn: psycopg.AsyncConnection[Any], reports: list[Report], log: logging.Logger
) -> None:
    """Send `reports` in order, removing each once the engine has it.

    A lost connection raises and keeps the unsent ones (they are sent again after reconnecting).
    An output the engine refuses (too large, not storable) fails its task instead; any other
    refusal is logged and the report dropped, so one bad result never blocks the others.
    """
    while reports:
        if await _send_batch(conn, reports):
            continue
        report = reports[0]
        task = report.task
        key = (task.run_id, task.step_slug, task.task_index)
        try:
            await conn.execute(*_callback(report))
        except psycopg.Error as exc:
            if connection_lost(conn, exc):
                raise
            if report.error is None and not isinstance(exc, psycopg.errors.NoDataFound):
                reports[0] = Report(
                    task, error=f"The engine refused the handler's output: {primary_message(exc)}"
                )
                continue
            log.error("could not report task %s/%s[%d]: %s", *key, primary_message(exc))
        reports.pop(0)


async def _send_batch(conn: psycopg.AsyncConnection[Any], reports: list[Report]) -> bool:
    """Complete the leading successes with one complete_tasks call (one statement, one round
    trip); False when there are fewer than two or the call failed.

    complete_tasks changes nothing when it fails, and a second complete_task for a completed
    task is a no-op, so after a failure they are simply sent again one by one, which isolates
    the bad one. Failures are never batched: a repeated fail_task could hit the task's next
    attempt.
    """
    batch = []
    for report in reports:
        if report.error is not None:
            break
        batch.append(report)
    if len(batch) < 2:
        return False
    try:
        await conn.execute(
            "select from pgflow.complete_tasks(%s, %s, %s, %s::jsonb[])",
            (
                [r.task.run_id for r in batch],
                [r.task.step_slug for r in batch],
                [r.task.task_index for r in batch],
                [Jsonb(r.output) for r in batch],
            ),
        )
    except psycopg.Error as exc:
        if connection_lost(conn, exc):
            raise
        return False
    del reports[: len(batch)]
    return True


def _callback(report: Report) -> tuple[str, tuple[Any, ...]]:
    """The engine call that reports one finished handler: complete_task or fail_task."""
    task = report.task
    key = (task.run_id, task.step_slug, task.task_index)
    if report.error is None:
        return "select from pgflow.complete_task(%s, %s, %s, %s)", (*key, Jsonb(report.output))
    return "select from pgflow.fail_task(%s, %s, %s, %s)", (*key, report.error)

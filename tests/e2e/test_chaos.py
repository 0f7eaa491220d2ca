"""The chaos soak, short: step workers SIGKILLed and restarted every 1-2 s, one PostgreSQL
crash-restart, runs started throughout; afterwards every run completed with the right output,
none is lost, handlers ran again only as often as the kills allow, and every worker stopped with
SIGTERM exits 0. The long version with its figures is `benchmarks/chaos.py`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import chaos
from pgflow_gen.runtime import embedded


@pytest.fixture
def crashable() -> Iterator[embedded.EmbeddedServer]:
    with chaos.crashable_server() as server:
        yield server


def test_kills_and_a_crash_restart_lose_no_run(
    crashable: embedded.EmbeddedServer, tmp_path: Path
) -> None:
    report = chaos.soak(
        crashable, runs=40, chaos_s=8.0, crashes=1, seed=11, drain_deadline_s=150.0, logs=tmp_path
    )
    details = "\n".join(report.lines())
    assert report.kills >= 3, details
    assert report.crashes == 1, details
    assert report.lost == 0, details
    assert report.completed_correct == 40, details
    assert report.executions >= report.tasks, details  # every task ran
    assert report.duplicates <= report.duplicate_bound, details
    assert report.exit_codes == [0, 0, 0, 0], details


def test_a_slow_database_fails_no_run_and_runs_no_handler_twice(
    crashable: embedded.EmbeddedServer, tmp_path: Path
) -> None:
    report = chaos.slow_database(
        crashable, runs=30, chaos_s=8.0, seed=5, drain_deadline_s=150.0, logs=tmp_path
    )
    details = "\n".join(report.lines())
    assert report.cancels >= 1, details
    assert report.lock_holds >= 1, details
    assert report.lost == 0, details
    assert report.failed == 0, details  # no run failed by the database
    assert report.completed_correct == 30, details
    assert report.duplicates == 0, details  # nothing died, so nothing ran twice
    assert report.exit_codes == [0, 0, 0, 0], details

"""No run stays started for ever (engine 0020): random interleavings of claims, completions,
failures, crashes, stall recovery, cancels, retries, pauses, signals and stale resends on the real
engine keep every started run movable, and every run finishes once its workers come back. The
walks are in machine.py; this is their short form for `make test` (fixed seeds, so a run of the
suite is repeatable; benchmarks/interleavings.py walks fresh seeds for minutes)."""

from __future__ import annotations

import pytest

from tests.engine import Engine
from tests.sql.interleavings.machine import Figures, Walk, define


@pytest.mark.parametrize("seed", range(8))
def test_every_started_run_can_move_and_every_run_finishes(engine: Engine, seed: int) -> None:
    define(engine)
    figures = Figures()
    Walk(engine, figures, seed).walk(steps=200)
    assert figures.checks > 0
    assert sum(figures.outcomes.values()) == figures.actions["start"]

"""Upgrading 0025 to 0026 (start_flow and start_flows read the flow's definition once; start_flow
returns the row it inserted; start_flows pairs the new runs with their inputs from its insert):
work claimed on 0025 finishes, and the same starts made before and after the upgrade return the
same runs, leave the same rows, announce the same events and refuse the same bad input."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.engine import Engine
from tests.upgrades import announced, claimed_work_finishes, engine_at, upgrade_to

#: Columns that differ between two runs of the same starts (ids, times, message ids).
VOLATILE = {"run_id", "started_at", "created_at", "queued_at", "message_id", "idempotency_key",
            "completed_at", "skipped_at"}  # fmt: skip


@pytest.fixture
def version_25(empty_db_url: str) -> Iterator[Engine]:
    with engine_at(empty_db_url, "0025") as engine:
        yield engine


def upgrade(engine: Engine) -> None:
    upgrade_to(engine, "0026")


def test_work_claimed_on_0025_finishes(version_25: Engine) -> None:
    claimed_work_finishes(version_25, upgrade)


def define(engine: Engine) -> None:
    engine.flow("chain", {"slug": "a"}, {"slug": "b", "deps_slugs": ["a"]})
    engine.flow("roots", {"slug": "left"}, {"slug": "right"})
    engine.flow("mapped", {"slug": "each", "step_type": "map"})
    engine.flow(
        "gated",
        {"slug": "a", "required_input_pattern": {"go": True}},
        {"slug": "b", "deps_slugs": ["a"]},
    )


def stable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in VOLATILE}


def starts(engine: Engine, listener: psycopg.Connection[Any], tag: str) -> list[Any]:
    """Runs started one by one and in bulk (with idempotency keys, one repeated, one taken
    already); what each call returned, what each run's rows hold, and each run's events."""
    returned: list[dict[str, Any]] = []
    for flow, input in (("chain", {"n": 1}), ("roots", {}), ("mapped", [1, 2, 3]),
                        ("gated", {"go": True}), ("gated", {"go": False})):  # fmt: skip
        run_id = uuid.uuid4()
        listener.execute(f"listen pgflow_run_{run_id.hex}")
        returned += engine.call("start_flow", flow, Jsonb(input), run_id=run_id)
    returned += engine.call("start_flow", "chain", {"n": 2}, idempotency_key=f"{tag}-one")
    returned += engine.call("start_flow", "chain", {"n": 3}, idempotency_key=f"{tag}-one")
    returned += engine.call("start_flows", "chain", [Jsonb({"n": n}) for n in (4, 5)])
    returned += engine.call(
        "start_flows", "chain", [Jsonb({"n": n}) for n in (6, 7, 8)],
        idempotency_keys=[f"{tag}-one", f"{tag}-two", f"{tag}-two"],
    )  # fmt: skip
    returned += engine.call("start_flows", "mapped", [Jsonb([1]), Jsonb([])])
    returned += engine.call("start_flows", "gated", [Jsonb({"go": True}), Jsonb({"go": 0})])
    events = announced(listener, EVENTS)
    first: dict[uuid.UUID, int] = {}  # each run by the position of the call that first returned it
    for at, run in enumerate(returned):
        first.setdefault(run["run_id"], at)
    return [
        (
            first[run["run_id"]],
            stable(run),
            stable(engine.run(run["run_id"])),
            [stable(s) for s in engine.all(
                "select * from pgflow.step_states where run_id = %s order by step_slug",
                run["run_id"])],
            [stable(t) for t in engine.all(
                "select * from pgflow.step_tasks where run_id = %s order by step_slug, task_index",
                run["run_id"])],
            events.get(run["run_id"]),
        )
        for run in returned
    ]  # fmt: skip


#: The events of the five runs started one by one: chain 2, roots 3, mapped 2, gated
#: (go) 2, gated (no go: its root is skipped, its child starts without that input) 3.
EVENTS = 12


def test_the_same_starts_return_and_leave_the_same_rows(
    version_25: Engine, empty_db_url: str
) -> None:
    engine = version_25
    define(engine)
    with psycopg.connect(empty_db_url, autocommit=True) as listener:
        before = starts(engine, listener, "before")
        upgrade(engine)
        after = starts(engine, listener, "after")

    assert after == before
    assert [r[1]["status"] for r in after[:5]] == ["started"] * 5
    assert sum(len(r[5] or []) for r in after) == EVENTS
    # A repeated key returns the run its first use started; every other call starts one.
    assert [r[0] for r in after] == [0, 1, 2, 3, 4, 5, 5, 7, 8, 5, 10, 10, 12, 13, 14, 15]


@pytest.mark.parametrize(
    ("call", "args", "message"),
    [
        ("start_flow", ("nowhere", Jsonb({})), 'Flow "nowhere" does not exist.'),
        ("start_flows", ("nowhere", [Jsonb({})]), 'Flow "nowhere" does not exist.'),
        ("start_flow", ("mapped", Jsonb({})), "so the input must be a JSON array, got object"),
        ("start_flows", ("mapped", [Jsonb([]), Jsonb(1)]), "so input 2 must be a JSON array"),
    ],
)
def test_bad_starts_are_refused_as_before(
    version_25: Engine, call: str, args: tuple[Any, ...], message: str
) -> None:
    engine = version_25
    define(engine)
    with pytest.raises(psycopg.Error, match=message):
        engine.call(call, *args)
    upgrade(engine)
    with pytest.raises(psycopg.Error, match=message):
        engine.call(call, *args)
    assert engine.value("select count(*) from pgflow.runs") == 0

"""Upgrading 0022 to 0023 (an operator's limits stay until reset): work claimed on 0022
finishes; limits the spec set become the steps' baselines and limits an operator set become
overrides, by the role that set them, which the next worker start keeps and a reset removes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.engine import Engine
from tests.upgrades import claimed_work_finishes, engine_at, upgrade_to


@pytest.fixture
def version_22(empty_db_url: str) -> Iterator[Engine]:
    with engine_at(empty_db_url, "0022") as engine:
        yield engine


def upgrade(engine: Engine) -> None:
    upgrade_to(engine, "0023")


def test_work_claimed_on_0022_finishes(version_22: Engine) -> None:
    claimed_work_finishes(version_22, upgrade)


def compile_specced(engine: Engine) -> dict[str, Any]:
    """`call` limited by the spec (4 in flight), `store` not."""
    return engine.compile(
        "specced",
        [{"slug": "call", "options": {"maxInFlight": 4}}, {"slug": "store", "deps": ["call"]}],
        options={},
    )


def test_spec_limits_become_baselines_and_an_operators_become_overrides(
    version_22: Engine,
) -> None:
    engine = version_22
    compile_specced(engine)
    engine.conn.execute("set pgflow.action_label = 'pgflow-gen (ada@ops)'")
    engine.call("set_step_limits", "specced", "store", max_in_flight=2)

    upgrade(engine)

    steps = engine.all(
        "select step_slug, opt_max_in_flight from pgflow.steps where flow_slug = 'specced'"
        " order by step_index"
    )
    assert steps == [
        {"step_slug": "call", "opt_max_in_flight": 4},
        {"step_slug": "store", "opt_max_in_flight": None},
    ]
    override = engine.one("select * from pgflow.step_limit_overrides")
    assert (override["step_slug"], override["max_in_flight"], override["label"]) == (
        "store", 2, "pgflow-gen (ada@ops)")  # fmt: skip
    assert override["actor"] == engine.value("select session_user")

    # An operator's cap over the spec's now survives the next worker start, until reset.
    engine.call("set_step_limits", "specced", "call", max_in_flight=1)
    compile_specced(engine)
    usage = {r["step_slug"]: r for r in engine.all("select * from pgflow.step_limit_usage()")}
    assert (usage["call"]["max_in_flight"], usage["call"]["spec_max_in_flight"]) == (1, 4)
    engine.call("reset_step_limits", "specced", "call")
    engine.call("reset_step_limits", "specced", "store")
    assert engine.all("select step_slug, max_in_flight, set_by from pgflow.step_limits") == [
        {"step_slug": "call", "max_in_flight": 4, "set_by": "spec"}
    ]

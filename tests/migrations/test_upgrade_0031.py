"""Upgrading 0030 to 0031 (run priority): work claimed on 0030 finishes, runs started on 0030
have priority 0 and are claimed first in, first out behind a prioritised run started on 0031,
and a client without a priority still starts runs on 0030."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pgflow_gen.errors import UsageError
from pgflow_gen.runtime import Client
from tests.e2e.harness import run_cli
from tests.engine import WORKER_ID, Engine
from tests.upgrades import claimed_work_finishes, engine_at, upgrade_to


@pytest.fixture
def version_30(empty_db_url: str) -> Iterator[Engine]:
    with engine_at(empty_db_url, "0030") as engine:
        yield engine


def upgrade(engine: Engine) -> None:
    upgrade_to(engine, "0031")


def test_work_claimed_on_0030_finishes(version_30: Engine) -> None:
    claimed_work_finishes(version_30, upgrade)


def test_runs_of_0030_keep_their_order_behind_a_prioritised_run_of_0031(version_30: Engine) -> None:
    engine = version_30
    engine.flow("plain", {"slug": "only"})
    old = [engine.start("plain", {"n": n}) for n in range(2)]

    upgrade(engine)

    # The queue of 0030 got its index of prioritised messages.
    assert (
        engine.value(
            "select count(*) from pg_indexes where schemaname = 'pgmq' and tablename = 'q_plain'"
            " and indexname = 'pgflow_priority_' || md5('plain')"
        )
        == 1
    )
    urgent = engine.start("plain", priority=2)
    assert [engine.run(r)["priority"] for r in old] == [0, 0]
    engine.register("plain")
    claimed = [
        row[0]
        for _ in range(3)
        for row in engine.conn.execute(
            "select run_id from pgflow.read_and_claim('plain', 'plain', %s, 1, 30)", (WORKER_ID,)
        ).fetchall()
    ]
    assert claimed == [urgent, *old]


def test_a_client_starts_runs_on_0030_and_says_a_priority_needs_0031(
    version_30: Engine, empty_db_url: str
) -> None:
    version_30.flow("plain", {"slug": "only"})
    with Client(empty_db_url) as client:
        assert client.start_flow("plain", {}).status == "started"
        with pytest.raises(UsageError) as refused:
            client.start_flow("plain", {}, priority=3)
    assert str(refused.value) == (
        "Run priorities need engine 0031 or later; nothing was started.\n"
        "HINT: Upgrade the engine with `pgflow-gen db migrate`, or start without a priority."
    )
    assert version_30.value("select count(*) from pgflow.runs") == 1


def test_pgflow_gen_start_says_a_priority_needs_0031_on_0030(
    version_30: Engine, empty_db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    version_30.flow("plain", {"slug": "only"})
    inputs = tmp_path / "runs.jsonl"
    inputs.write_text("{}\n{}\n")
    for given in (["--input", "{}"], ["--inputs", str(inputs)]):
        code, out, err = run_cli(capsys, empty_db_url, "start", "plain", *given, "--priority", "3")
        assert (code, out) == (2, "")
        assert err == (
            "error: Run priorities need engine 0031 or later; nothing was started.\n"
            "HINT: Upgrade the engine with `pgflow-gen db migrate`, or start without a priority.\n"
        )
    assert version_30.value("select count(*) from pgflow.runs") == 0

"""Upgrading 0021 to 0022 (a worker's state decided once, by pgflow.worker_states): work claimed
on 0021 finishes; `pgflow-gen workers` and `coverage` tell the same states on either engine of
the support window, as a reader whose grants were made on 0021, and `db migrate` grants that
reader the new function."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from pgflow_gen import cli
from tests.engine import Engine
from tests.roles import logins_on
from tests.upgrades import claimed_work_finishes, engine_at, upgrade_to

LIVE = uuid.UUID("00000000-0000-0000-0000-0000000000b1")
STALE = uuid.UUID("00000000-0000-0000-0000-0000000000b2")
STOPPED = uuid.UUID("00000000-0000-0000-0000-0000000000b3")


@pytest.fixture
def version_21(empty_db_url: str) -> Iterator[Engine]:
    with engine_at(empty_db_url, "0021") as engine:
        yield engine


def upgrade(engine: Engine) -> None:
    upgrade_to(engine, "0022")


def test_work_claimed_on_0021_finishes(version_21: Engine) -> None:
    engine = version_21
    claimed_work_finishes(engine, upgrade)


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> object:
    assert cli.main([*argv, "--format", "json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def seen(capsys: pytest.CaptureFixture[str], url: str) -> tuple[dict[str, str], object]:
    """Each worker's state (`workers --all`) and the coverage (`coverage`), as `url` sees them."""
    workers = cli_json(capsys, "workers", "--all", "--database-url", url)
    assert isinstance(workers, dict)
    states = {w["name"]: w["state"] for w in workers["workers"]}
    return states, cli_json(capsys, "coverage", "--database-url", url)


def test_workers_and_coverage_read_the_same_before_and_after(
    version_21: Engine, empty_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = version_21
    engine.flow("orders", {"slug": "pay"})
    for worker in (LIVE, STALE, STOPPED):
        engine.call("register_worker", worker, "orders", f"w-{worker.hex[-2:]}", flow_slug="orders")
    engine.conn.execute(
        "update pgflow.workers set last_heartbeat_at = now() - interval '1 min'"
        " where worker_id <> %s",
        (LIVE,),
    )
    engine.call("mark_worker_stopped", STOPPED)
    for logins in logins_on(engine.conn, empty_db_url):  # `db roles --apply` on 0021
        reader = logins.url_of(logins.login_role("reader"))

        on_0021 = seen(capsys, reader)
        assert on_0021[0] == {"w-b1": "live", "w-b2": "stale", "w-b3": "stopped"}
        with pytest.raises(psycopg.errors.UndefinedFunction):
            logins.login("reader").execute("select * from pgflow.worker_states()")

        assert cli.main(["db", "migrate", "--database-url", empty_db_url]) == 0
        assert "applying 0022_worker_states" in capsys.readouterr().out

        assert seen(capsys, reader) == on_0021
        count = logins.login("reader").execute("select count(*) from pgflow.worker_states()")
        assert count.fetchone() == (3,)

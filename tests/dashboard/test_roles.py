"""The dashboard with the least roles it needs (engine 0019): a reader's dashboard shows every
page; a client's runs the run actions and is refused the admin's, saying why."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dashboard.conftest import (
    SHOWCASE,
    TOKEN,
    Dashboard,
    define_showcase,
    finished_showcase,
    start_dashboard,
)
from tests.dashboard.test_actions import csrf, outcome, sign_in
from tests.e2e.harness import Db
from tests.roles import Logins


@pytest.fixture
def as_role(logins: Logins, tmp_path: Path) -> Iterator[dict[str, Dashboard]]:
    """A dashboard per kind of role, started on first use."""
    started: dict[str, Dashboard] = {}

    class Lazy(dict[str, Dashboard]):
        def __missing__(self, kind: str) -> Dashboard:
            url = logins.url_of(logins.login_role(kind))
            args = ("--allow-actions",) if kind != "reader" else ()
            started[kind] = start_dashboard(url, tmp_path, *args, PGFLOW_DASHBOARD_TOKEN=TOKEN)
            return started[kind]

    yield Lazy()
    for dashboard in started.values():
        dashboard.stop()


def test_a_readers_dashboard_shows_every_page(as_role: dict[str, Dashboard], db: Db) -> None:
    define_showcase(db)
    run_id = finished_showcase(db)
    db.start(SHOWCASE, {"url": "x"})
    dashboard = as_role["reader"]
    cookie = sign_in(dashboard)
    for path in ("/", "/runs", f"/runs/{run_id}", "/queues", "/workers"):
        page = dashboard.get(path, cookie=cookie)
        assert page.status == 200, (path, page.body[:500])
    assert "parse" in dashboard.get(f"/runs/{run_id}", cookie=cookie).body
    metrics = dashboard.get("/metrics", html=False, token=TOKEN)
    assert metrics.status == 200
    assert f'pgflow_runs{{flow="{SHOWCASE}",status="failed"}} 1' in metrics.body
    assert "Traceback" not in dashboard.log()


def test_a_clients_dashboard_retries_and_is_refused_a_pause(
    as_role: dict[str, Dashboard], db: Db
) -> None:
    define_showcase(db)
    run_id = finished_showcase(db)
    dashboard = as_role["client"]
    cookie = sign_in(dashboard)
    token = csrf(dashboard, f"/runs/{run_id}", cookie)

    retried = dashboard.post(f"/runs/{run_id}/retry", {"csrf": token}, cookie=cookie)
    assert outcome(retried.headers["location"]) == f"Retried run {run_id} from where it failed."
    paused = dashboard.post(
        f"/flows/{SHOWCASE}/steps/parse/pause", {"csrf": token, "reason": "x"}, cookie=cookie
    )
    assert paused.status == 303
    assert outcome(paused.headers["location"]) == "permission denied for function pause_step"
    assert [r["action"] for r in db.all("select action from pgflow.operator_actions")] == ["retry"]
    assert db.value("select count(*) from pgflow.step_pauses") == 0
    assert "Traceback" not in dashboard.log()

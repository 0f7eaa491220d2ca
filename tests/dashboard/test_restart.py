"""After its database restarts, the dashboard's first request is served: the pool replaces the
connections the restart dropped before a page gets one (it used to answer 503 once per dead
connection). A server of the test's own, stopped and started."""

from __future__ import annotations

from pathlib import Path

from pgflow_gen.runtime import embedded
from tests.dashboard.conftest import start_dashboard


def test_the_first_page_after_a_database_restart_is_served(
    own_server: embedded.EmbeddedServer, tmp_path: Path
) -> None:
    dashboard = start_dashboard(own_server.url(), tmp_path)
    try:
        for page in ("/", "/runs", "/queues", "/workers"):  # the pool holds open connections
            assert dashboard.get(page).status == 200, page
        own_server.stop()
        own_server.ensure_started()
        for page in ("/runs", "/queues", "/workers", "/"):
            answer = dashboard.get(page)
            assert answer.status == 200, (page, answer.body[:500])
    finally:
        assert dashboard.stop() in (0, 130)
    assert "Traceback" not in dashboard.log()

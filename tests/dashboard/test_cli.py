"""`pgflow-gen dashboard` and `pgflow-gen metrics` as commands: each refusal is one line with a
hint and its exit status (never a traceback), and the metrics say what the engine holds."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pgflow_gen import cli
from tests.dashboard.conftest import TOKEN, Dashboard, start_dashboard
from tests.e2e.harness import Db, eventually
from tests.engine import WORKER_ID


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (["--host", "0.0.0.0"], {},
         "error: Listening on 0.0.0.0 would show the dashboard to anyone who can reach this"
         " machine, so it needs a token."),
        (["--allow-actions"], {},
         "error: --allow-actions needs a token, so that not anyone who reaches the page can act."),
        (["--token", "short"], {}, "error: The token must be at least 8 characters long."),
        (["--host", "0.0.0.0"], {"PGFLOW_DASHBOARD_TOKEN": "abc"},
         "error: The token must be at least 8 characters long."),
    ],
    ids=["exposed", "actions", "short-token", "short-token-env"],
)  # fmt: skip
def test_refusals_are_usage_errors(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    db_url: str,
    args: list[str],
    env: dict[str, str],
    said: str,
) -> None:
    monkeypatch.delenv("PGFLOW_DASHBOARD_TOKEN", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, out, err = run_cli(capsys, "dashboard", *args, "--database-url", db_url)
    assert (code, out) == (2, "")
    assert err.splitlines()[0] == said
    assert err.splitlines()[1].startswith("HINT: ")


def test_a_database_without_the_engine_says_to_migrate(
    capsys: pytest.CaptureFixture[str], empty_db_url: str
) -> None:
    code, out, err = run_cli(capsys, "dashboard", "--database-url", empty_db_url)
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        "error: The database has no pgflow engine (or an older one).",
        "DETAIL: It has no engine migrations (pgflow.schema_migrations).",
        "HINT: Run `pgflow-gen db migrate` against this database first.",
    ]


def test_an_unreachable_database_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    code, out, err = run_cli(
        capsys, "dashboard", "--database-url", f"postgresql://u:pw@127.0.0.1:{port}/x"
    )
    assert (code, out) == (1, "")
    assert err.startswith("error: cannot reach the database: ")
    assert len(err.splitlines()) <= 2
    assert "pw@" not in err
    assert "Traceback" not in err


def test_a_port_in_use_is_one_line(capsys: pytest.CaptureFixture[str], db_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = run_cli(capsys, "dashboard", "--port", str(port), "--database-url", db_url)
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        f"error: Cannot listen on 127.0.0.1:{port}: Address already in use.",
        "HINT: Pick another --port, or stop what listens there.",
    ]


def test_ctrl_c_stops_the_dashboard_cleanly(db_url: str, tmp_path: Path) -> None:
    dashboard = start_dashboard(db_url, tmp_path)
    assert dashboard.get("/").status == 200
    assert dashboard.stop() == 130  # as every command's Ctrl-C
    assert "Traceback" not in dashboard.log()


def test_metrics_say_what_the_engine_holds(
    capsys: pytest.CaptureFixture[str], db: Db, db_url: str
) -> None:
    db.compile("stepped", [{"slug": "first"}, {"slug": "second", "dependencies": ["first"]}])
    for _ in range(3):
        db.start("stepped")
    db.register("stepped__first")
    db.call("pause_step", "stepped", "second", None)
    db.call("set_step_limits", "stepped", "first", max_in_flight=2, rate_limit=5, rate_period_s=60)
    db.conn.execute(
        "select * from pgflow.read_and_claim('stepped', 'stepped__first', %s, 10, 30, 'first')",
        (WORKER_ID,),
    )
    keyed = {"concurrencyKey": "$.tenant", "concurrencyLimit": 1}
    db.compile("keyed", [{"slug": "work", "options": keyed}], options={})
    for tenant in ("a", "a", "a", "b", "b"):
        db.start("keyed", {"tenant": tenant})
    spec = {"maxInFlight": 3, "rateLimit": 10, "ratePeriod": 60}
    db.compile("specced", [{"slug": "call", "options": spec}], options={})
    db.call("set_step_limits", "specced", "call", max_in_flight=1)  # an operator's override
    overridden_at = db.value(
        "select set_at from pgflow.step_limit_overrides where flow_slug = %s", "specced"
    )

    code, out, err = run_cli(capsys, "metrics", "--database-url", db_url)

    assert (code, err) == (0, ""), err
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(out)
        for s in family.samples
    }
    first = (("flow", "stepped"), ("queue", "stepped__first"), ("step", "first"))
    second = (("flow", "stepped"), ("queue", "stepped__second"), ("step", "second"))
    assert samples[("pgflow_queue_messages", (("queue", "stepped__first"),))] == 3
    assert samples[("pgflow_queue_visible_messages", (("queue", "stepped__first"),))] == 1
    assert samples[("pgflow_queue_sent_messages_total", (("queue", "stepped__first"),))] == 3
    assert samples[("pgflow_route_covered", first)] == 1
    assert samples[("pgflow_route_covered", second)] == 0
    assert samples[("pgflow_step_paused", second)] == 1
    assert samples[("pgflow_step_tasks", tuple(sorted((*first, ("status", "queued")))))] == 1
    assert samples[("pgflow_step_max_in_flight", first)] == 2
    assert samples[("pgflow_step_limited_in_flight", first)] == 2
    rated = tuple(sorted((*first, ("period_seconds", "60"))))
    assert samples[("pgflow_step_rate_limit", rated)] == 5
    assert samples[("pgflow_step_rate_window_starts", first)] == 2
    assert ("pgflow_step_max_in_flight", second) not in samples  # only limited steps
    work = (("flow", "keyed"), ("queue", "keyed__work"), ("step", "work"))
    assert samples[("pgflow_step_concurrency_limit", work)] == 1
    assert samples[("pgflow_step_keys_waiting", work)] == 2
    assert samples[("pgflow_step_parked_by_key", work)] == 3
    assert ("pgflow_step_keys_waiting", first) not in samples  # only keyed steps
    call = (("flow", "specced"), ("queue", "specced__call"), ("step", "call"))
    assert samples[("pgflow_step_max_in_flight", call)] == 1
    assert samples[("pgflow_step_spec_max_in_flight", call)] == 3
    spec_rated = tuple(sorted((*call, ("period_seconds", "60"))))
    assert samples[("pgflow_step_spec_rate_limit", spec_rated)] == 10
    assert samples[("pgflow_step_limits_overridden_since", call)] == overridden_at.timestamp()
    # An operator's limits on a step the spec does not limit override nothing.
    assert ("pgflow_step_limits_overridden_since", first) not in samples
    assert samples[("pgflow_runs", (("flow", "stepped"), ("status", "started")))] == 3
    assert samples[("pgflow_stalled_tasks", first)] == 0
    # The test's worker registered without a flow (a label is never missing: it is empty).
    live = (("flow", ""), ("queue", "stepped__first"), ("state", "live"), ("step", ""))
    assert samples[("pgflow_workers", live)] == 1


def test_metrics_serve_needs_the_token_when_it_has_one(
    db_url: str, tmp_path: Path, start: Callable[..., Dashboard]
) -> None:
    log = tmp_path / "metrics.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pgflow_gen.cli", "metrics", "--serve", "--port", "0",
             "--token", TOKEN, "--database-url", db_url],
            stdout=out, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    try:
        url = eventually(
            lambda: next((w for w in log.read_text().split() if w.startswith("http://")), None),
            "the metrics address",
        )
        served = Dashboard(proc, url.removesuffix("/metrics"), log)
        assert served.get("/metrics", html=False).status == 401
        reply = served.get("/metrics", html=False, token=TOKEN)
        assert reply.status == 200
        assert "pgflow_runs" in reply.body
        assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    dashboard = start()  # the dashboard serves the same, open on loopback
    assert "pgflow_route_covered" in dashboard.get("/metrics", html=False).body


def test_an_open_dashboard_answers_only_to_loopback_and_its_allowed_hosts(
    start: Callable[..., Dashboard],
) -> None:
    """DNS rebinding: another site's page, its name pointed at 127.0.0.1, asks under its own
    name and is refused; the names the operator allowed are served."""
    open_one = start("--allowed-host", "box.internal")
    port = open_one.url.rsplit(":", 1)[1]
    refused = open_one.get("/", host=f"evil.example:{port}")
    assert refused.status == 400
    assert "does not answer to that host name" in refused.body
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"box.internal:{port}"):
        assert open_one.get("/", host=host).status == 200, host
    assert "refused a request for host 'evil.example:" in open_one.log()
    # With a token the name does not matter: a rebound page has no token.
    guarded = start(PGFLOW_DASHBOARD_TOKEN=TOKEN)
    guarded_port = guarded.url.rsplit(":", 1)[1]
    assert guarded.get("/", token=TOKEN, host=f"evil.example:{guarded_port}").status == 200

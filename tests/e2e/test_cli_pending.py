"""`pgflow-gen runs --pending`: the debounced starts whose runs have not started yet (engine
0030), as a table and as JSON, and its mistakes in one line."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from tests.e2e.harness import run_cli
from tests.engine import Engine


def test_runs_pending_lists_the_bursts_the_soonest_first(
    conn: psycopg.Connection[Any], db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = Engine(conn)
    engine.flow("digest", {"slug": "send"})
    engine.flow("other", {"slug": "only"})
    for key, period in (("user-7", 600), ("user-8", 60), ("user-7", 600)):
        conn.execute(
            "select pgflow.debounce_start('digest', %s::jsonb, %s, %s)",
            (json.dumps({"user": key}), key, period),
        )
    conn.execute("select pgflow.debounce_start('other', '{}', 'x', 900, 1200)")

    code, out, _ = run_cli(capsys, db_url, "runs", "--pending", "--format", "json")
    assert code == 0
    pending = json.loads(out)["pending"]
    assert [(p["flow_slug"], p["debounce_key"], p["starts"], p["input"]) for p in pending] == [
        ("digest", "user-8", 1, {"user": "user-8"}),
        ("digest", "user-7", 2, {"user": "user-7"}),
        ("other", "x", 1, {}),
    ]
    assert pending[2]["deadline_at"] is not None

    code, out, _ = run_cli(capsys, db_url, "runs", "--pending", "--flow", "other")
    assert code == 0
    [header, _rule, row] = out.splitlines()
    assert header.split() == ["flow", "debounce", "key", "starts", "first", "last", "run",
                              "starts", "deadline"]  # fmt: skip
    assert row.split()[:3] == ["other", "x", "1"]


def test_runs_pending_mistakes_are_one_line(
    conn: psycopg.Connection[Any], db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(capsys, db_url, "runs", "--pending", "--status", "failed")
    assert code == 2
    assert err.splitlines()[0].endswith(
        "--pending lists starts, not runs: it takes no --status or --parent."
    )
    assert "Traceback" not in err
    code, _, err = run_cli(capsys, db_url, "runs", "--pending", "--flow", "nope")
    assert code == 2
    assert "nope" in err.splitlines()[0]

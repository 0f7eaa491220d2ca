"""The operations commands against live worker processes: start, status, runs, workers, coverage."""

from __future__ import annotations

import json
import signal

import pytest

from pgflow_gen import cli
from tests.e2e.harness import Db, Workers


def run_cli(capsys: pytest.CaptureFixture[str], db_url: str, *args: str) -> tuple[int, str]:
    code = cli.main([*args, "--database-url", db_url])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_coverage_counts_only_live_workers_and_each_route_once(
    workers: Workers, db: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    workers.start("e2e_steps", "first").started()
    workers.start("e2e_steps", "first").started()  # a second instance of one route
    stopped = workers.start("e2e_steps", "second").started()
    stale = workers.start("e2e_steps", "side").started()
    assert stopped.stop() == 0
    stale.signal(signal.SIGKILL)
    stale.wait()
    db.conn.execute(
        "update pgflow.workers set last_heartbeat_at = now() - interval '1 minute'"
        " where queue_name = 'e2esteps__side'"
    )
    db.conn.execute(
        "select pgflow.register_worker(gen_random_uuid(), 'e2esteps__second', 'old', 'e2eSteps',"
        " 'second')"
    )
    db.conn.execute("update pgflow.workers set deprecated_at = now() where function_name = 'old'")

    code, out = run_cli(capsys, db_url, "coverage", "--format", "json")
    assert code == 1
    report = json.loads(out)
    assert report["ok"] is False
    assert [(r["step_slug"], r["live_workers"], r["covered"]) for r in report["routes"]] == [
        ("first", 2, True),
        ("second", 0, False),
        ("side", 0, False),
    ]

    workers.start("e2e_steps", "second").started()
    workers.start("e2e_steps", "side").started()
    code, out = run_cli(capsys, db_url, "coverage")
    assert code == 0
    assert "3 of 3 route(s) covered" in out
    code, out = run_cli(capsys, db_url, "coverage", "--flow", "otherFlow")
    assert (code, out.splitlines()[0]) == (
        2,
        'error: No flow "otherFlow" is compiled in this database.',
    )
    assert "Compiled flows: " in out
    code, out = run_cli(capsys, db_url, "coverage", "--flow", "e2esteps")
    assert code == 2
    assert 'HINT: Did you mean "e2eSteps"? Slugs are exact.' in out
    code, out = run_cli(capsys, db_url, "runs", "--flow", "otherFlow")
    assert (code, out.splitlines()[0]) == (
        2,
        'error: No flow "otherFlow" is compiled in this database.',
    )


def test_start_wait_status_runs_and_workers(
    workers: Workers, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    workers.start("e2e_plain", "worker").started()
    code, out = run_cli(capsys, db_url, "start", "e2ePlain", "--input", '{"name": "ada"}', "--wait")
    assert code == 0, out
    assert 'completed: {"wrap_up": "ADA!"}' in out
    run_id = out.split()[2]

    code, out = run_cli(capsys, db_url, "status", run_id)
    assert code == 0
    assert "status:  completed" in out
    assert [line.split()[:3] for line in out.splitlines()[-2:]] == [
        ["shout", "completed", "e2eplain"],
        ["wrap_up", "completed", "e2eplain"],
    ]

    code, out = run_cli(capsys, db_url, "runs", "--flow", "e2ePlain")
    assert code == 0
    assert f"{run_id}  e2ePlain  completed" in out

    code, out = run_cli(capsys, db_url, "workers")
    assert code == 0
    assert "e2ePlain  live   e2eplain" in out


def test_start_reports_bad_input_and_unknown_flows(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = run_cli(capsys, db_url, "start", "e2ePlain", "--input", "{nope")
    assert (code, out.splitlines()[0]) == (2, "error: --input is not JSON: Expecting property"
                                           " name enclosed in double quotes: line 1 column 2"
                                           " (char 1)")  # fmt: skip
    code, out = run_cli(capsys, db_url, "start", "missingFlow")
    assert code == 1
    assert "missingFlow" in out


def test_a_failed_run_makes_start_wait_exit_1(
    workers: Workers, db: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for entry in ("first", "second", "side"):
        workers.start("e2e_steps", entry).started()
    code, out = run_cli(
        capsys, db_url, "start", "e2eSteps", "--input", '{"n": 1, "fail_first": 9}', "--wait"
    )
    assert code == 1
    assert "failed: null" in out
    assert db.value("select count(*) from pgflow.runs where status = 'failed'") == 1

"""Retrying runs, signal steps and permanent errors with worker processes and the command line:
a run that failed is retried from its failed step with `pgflow-gen retry`, waits for its signal
(which `status` and `start --wait` say), and goes on when `pgflow-gen signal` sends it; a
handler's PermanentError fails its task at once, whatever attempts are left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from pgflow_gen import cli
from tests.e2e.harness import PROJECT, Db, Workers, eventually


def run_cli(capsys: pytest.CaptureFixture[str], db_url: str, *args: str) -> tuple[int, str, str]:
    code = cli.main([*args, "--database-url", db_url])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def approvals(workers: Workers, db: Db) -> Db:
    for step in ("prepare", "finish"):
        workers.start("e2e_approvals", step).started()
    return db


def test_a_failed_run_retried_from_the_cli_runs_again_and_waits_for_its_signal(
    approvals: Db, db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gate = tmp_path / "gate"
    run_id = approvals.start("e2eApprovals", {"gate": str(gate)})
    failed = approvals.finished(run_id)
    assert failed["status"] == "failed"
    assert approvals.task(run_id, "prepare")["attempts_count"] == 2

    gate.touch()
    code, out, err = run_cli(capsys, db_url, "retry", str(run_id))
    assert (code, out, err) == (0, f"retried run {run_id} of e2eApprovals (started; retry 1)\n", "")

    def waiting() -> bool:
        return bool(approvals.state(run_id, "approval")["status"] == "started")

    eventually(waiting, "the approval step to wait for its signal")
    # A fresh budget (attempt 1 of it), its numbers going on from the two before the retry.
    prepare = approvals.task(run_id, "prepare")
    assert (prepare["attempts_count"], prepare["attempts_before_retry"]) == (3, 2)
    code, out, _ = run_cli(capsys, db_url, "status", str(run_id))
    assert code == 0
    assert "status:  started (waiting for a signal: approval)\n" in out
    assert "retried: 1 time, last at " in out
    [approval_line] = [line for line in out.splitlines() if line.startswith("approval ")]
    assert "waiting for a signal until " in approval_line
    assert f"pgflow-gen signal {run_id} approval --payload '<JSON>'" in out

    code, out, err = run_cli(
        capsys, db_url, "signal", str(run_id), "approval", "--payload", '{"ok": "yes"}'
    )
    assert code == 2
    assert err.startswith(
        'error: The payload does not match the schema of signal step "approval" of flow'
        ' "e2eApprovals".'
    )
    assert "$.ok: expected boolean, got string" in err
    code, out, err = run_cli(
        capsys, db_url, "signal", str(run_id), "approval", "--payload", '{"ok": true}'
    )
    assert (code, out, err) == (
        0, f"step approval of run {run_id} took the signal: the run goes on\n", "",
    )  # fmt: skip
    finished = approvals.finished(run_id)
    assert (finished["status"], finished["output"]) == (
        "completed", {"finish": "prepared and approved"},
    )  # fmt: skip
    code, _, err = run_cli(
        capsys, db_url, "signal", str(run_id), "approval", "--payload", '{"ok": false}'
    )
    assert code == 1
    assert err.startswith(f"error: Run {run_id} is completed, so it takes no signal.")


def test_start_wait_says_which_signal_it_waits_for_and_ends_when_it_comes(
    approvals: Db, db_url: str, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    gate.touch()
    waiting = subprocess.Popen(
        [sys.executable, "-m", "pgflow_gen.cli", "start", "e2eApprovals", "--input",
         json.dumps({"gate": str(gate)}), "--wait"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=PROJECT,
        env={**os.environ, "PGFLOW_DATABASE_URL": db_url},
    )  # fmt: skip
    assert waiting.stdout is not None
    assert waiting.stderr is not None
    run_id = uuid.UUID(waiting.stdout.readline().split()[2])
    said = waiting.stderr.readline()
    assert said.startswith("step approval waits for a signal until ")
    assert said.rstrip().endswith(
        f"send it with `pgflow-gen signal {run_id} approval --payload '<JSON>'`"
    )
    approvals.call("send_signal", run_id, "approval", {"ok": False})
    out, _ = waiting.communicate(timeout=60)
    assert waiting.returncode == 0
    assert out == 'completed: {"finish": "prepared and declined"}\n'


def test_a_permanent_error_fails_its_task_at_once(approvals: Db, tmp_path: Path) -> None:
    run_id = approvals.start("e2eApprovals", {"gate": str(tmp_path), "decline": True})
    assert approvals.finished(run_id)["status"] == "failed"
    task = approvals.task(run_id, "prepare")
    assert task["attempts_count"] == 1
    assert task["error_message"].split("\n")[:2] == [
        "PermanentError: declined: no attempt can change that",
        "Not retried (attempt 1 of 2): the handler raised PermanentError",
    ]


def test_retry_by_flow_asks_nobody_with_yes_and_names_what_it_cannot_retry(
    approvals: Db, db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    failed = approvals.start("e2eApprovals", {"gate": str(tmp_path), "decline": True})
    approvals.finished(failed)
    running = approvals.start("e2eApprovals", {"gate": str(tmp_path)})  # waits for approval
    code, out, err = run_cli(capsys, db_url, "retry", "--flow", "e2eApprovals", "--format", "json")
    assert code == 2
    assert "retry would retry 1 run and asks first, but there is no terminal" in err
    code, out, _ = run_cli(
        capsys, db_url, "retry", "--flow", "e2eApprovals", "--failed-since", "1h", "--yes",
        "--format", "json",
    )  # fmt: skip
    assert code == 0
    assert json.loads(out) == {
        "retried": [{"run_id": str(failed), "flow_slug": "e2eApprovals", "status": "started",
                     "retry_count": 1}],
        "not_retried": [],
    }  # fmt: skip
    code, _, err = run_cli(capsys, db_url, "retry", str(running))
    assert code == 1
    assert err == f"error: Run {running} is started; only a failed run can be retried.\n"


def test_signal_names_a_wrong_step_or_payload_and_sends_nothing(
    db: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db.conn.execute((PROJECT / "app/pgflow/migrations/e2eApprovals.sql").read_text())
    run_id = db.start("e2eApprovals", {"gate": "/nowhere"})

    def signal(step: str, payload: str) -> tuple[int, str]:
        code, out, err = run_cli(capsys, db_url, "signal", str(run_id), step, "--payload", payload)
        assert out == ""
        return code, err

    assert signal("aproval", "{}") == (2, (
        'error: Flow "e2eApprovals" has no signal step "aproval".\n'
        'HINT: Did you mean "approval"? Slugs are exact. Signal steps of e2eApprovals:'
        " approval.\n"
    ))  # fmt: skip
    assert signal("prepare", "{}")[1].startswith(
        'error: Step "prepare" of flow "e2eApprovals" is not a signal step'
    )
    assert signal("approval", "{ok: true}")[1].startswith("error: --payload is not JSON: ")
    code, err = run_cli(capsys, db_url, "signal", str(uuid.uuid4()), "approval", "--payload", "1")[
        ::2
    ]
    assert (code, err.startswith("error: Run ")) == (1, True)
    assert db.value("select count(*) from pgflow.signals") == 0

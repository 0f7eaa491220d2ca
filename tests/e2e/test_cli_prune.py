"""`pgflow-gen prune` against the real engine: it deletes only finished runs older than the age,
in batches until nothing is left, says what it did (or prints JSON), asks first on a terminal
and refuses without one."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.e2e.harness import Db, answered, run_cli


def finished(db: Db, days_ago: int, status: str = "completed") -> uuid.UUID:
    """A run of e2ePlain that ended `days_ago` days ago (completed, failed or cancelled)."""
    if status == "completed":
        run_id: uuid.UUID = db.run_to_end("e2ePlain", {}, {"name": "Ada"})["run_id"]
    else:
        run_id = db.start("e2ePlain", {"name": "Ada"})
    if status == "cancelled":
        db.call("cancel_run", run_id, "testing")
    while status == "failed" and db.run(run_id)["status"] == "started":
        [task] = db.poll("e2ePlain")
        db.fail(task)
        db.make_visible("e2eplain")  # the retry's delay is over
    column = {"completed": "completed_at", "failed": "failed_at", "cancelled": "cancelled_at"}
    db.conn.execute(
        f"update pgflow.runs set {column[status]} = now() - make_interval(days => %s)"
        " where run_id = %s",
        (days_ago, run_id),
    )
    assert db.run(run_id)["status"] == status
    return run_id


def left(db: Db) -> set[uuid.UUID]:
    return {row[0] for row in db.conn.execute("select run_id from pgflow.runs")}


def test_prunes_finished_runs_older_than_the_age_in_batches_and_says_what_it_did(
    plain: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    old = [finished(plain, 10) for _ in range(4)]
    old.append(finished(plain, 9, "failed"))
    recent = finished(plain, 1)
    running = plain.start("e2ePlain", {"name": "Grace"})
    plain.conn.execute(
        "update pgflow.runs set started_at = now() - interval '30 days' where run_id = %s",
        (running,),
    )

    code, out, err = run_cli(capsys, db_url, "prune", "--older-than", "7d", "--batch", "2", "--yes")

    assert (code, err) == (0, "")
    assert out.startswith(
        "pruned 5 finished runs, 0 archived messages and 0 silent workers older than 7d in"
        " 3 batches, "
    ), out
    assert left(plain) == {recent, running}
    assert not set(old) & {r[0] for r in plain.conn.execute("select run_id from pgflow.step_tasks")}


def test_json_gives_the_totals(plain: Db, db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    finished(plain, 3, "cancelled")
    finished(plain, 3)
    code, out, err = run_cli(
        capsys, db_url, "prune", "--older-than", "2d", "--yes", "--format", "json"
    )
    assert (code, err) == (0, "")
    assert json.loads(out) == {
        "runs": 2, "subflow_runs": 0, "archived_messages": 0, "workers": 0, "batches": 1,
        "older_than_s": 172800.0,
    }  # fmt: skip
    assert left(plain) == set()


def test_without_a_terminal_to_ask_on_nothing_is_pruned(
    plain: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = finished(plain, 10)
    code, out, err = run_cli(capsys, db_url, "prune", "--older-than", "7d")
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "error: prune deletes data and asks first, but there is no terminal to ask on.",
        "HINT: Pass --yes to prune without asking (as a scheduled job does).",
    ]
    assert left(plain) == {run_id}


@pytest.mark.parametrize("answer", ["y", "n"])
def test_on_a_terminal_it_says_what_will_go_and_asks(plain: Db, db_url: str, answer: str) -> None:
    run_id = finished(plain, 10)
    finished(plain, 10, "failed")
    exit_code, text = answered(db_url, answer, "prune", "--older-than", "7d")
    assert exit_code == 0, text  # "no" is an answer, not an error
    question = text.split("[y/N]")[0]
    assert "2 finished runs older than 7d (completed 1, failed 1, cancelled 0) will be deleted" in (
        question
    )
    tail = text.split("[y/N] ", 1)[1]
    if answer == "y":
        assert "pruned 2/2 runs (100 %), 0 archived messages" in tail  # the progress line
        assert "pruned 2 finished runs" in tail
        assert left(plain) == set()
    else:
        assert tail.splitlines()[-1] == "nothing pruned"  # after the echoed answer
        assert run_id in left(plain)


def test_a_dry_run_says_what_would_go_by_flow_and_status_and_deletes_nothing(
    plain: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    old = {finished(plain, 10), finished(plain, 10), finished(plain, 9, "failed")}
    recent = finished(plain, 1)
    code, out, err = run_cli(capsys, db_url, "prune", "--older-than", "7d", "--dry-run")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "would prune 3 finished runs older than 7d, with their steps and tasks:",
        "flow      status     runs",
        "--------  ---------  ----",
        "e2ePlain  completed  2",
        "e2ePlain  failed     1",
        "and the archived messages and silent workers older than 7d; nothing was deleted",
    ]
    code, out, err = run_cli(
        capsys, db_url, "prune", "--older-than", "7d", "--dry-run", "--format", "json"
    )
    assert json.loads(out) == {
        "dry_run": True, "runs": 3, "older_than_s": 604800.0,
        "by_flow": [{"flow_slug": "e2ePlain", "status": "completed", "runs": 2},
                    {"flow_slug": "e2ePlain", "status": "failed", "runs": 1}],
    }  # fmt: skip
    code, out, _ = run_cli(capsys, db_url, "prune", "--older-than", "30d", "--dry-run")
    assert out.splitlines() == [
        "would prune 0 finished runs older than 30d, with their steps and tasks",
        "and the archived messages and silent workers older than 30d; nothing was deleted",
    ]
    assert left(plain) == old | {recent}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--older-than", "7d", "--batch", "0"], "error: --batch must be at least 1."),
        (["--older-than", "a week"], "invalid age 'a week'"),
        ([], "the following arguments are required: --older-than"),
    ],
    ids=["batch", "age", "missing-age"],
)
def test_wrong_arguments_are_usage_errors(
    plain: Db, db_url: str, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    run_id = finished(plain, 10)
    try:
        code, out, err = run_cli(capsys, db_url, "prune", *args, "--yes")
    except SystemExit as exited:  # the parser's own refusals
        code, out, err = int(str(exited.code)), "", capsys.readouterr().err
    assert (code, out) == (2, "")
    assert message in err
    assert "Traceback" not in err
    assert left(plain) == {run_id}

"""`pgflow-gen cancel` against the real engine: by run id or by flow and age, asking first (or
refusing without a terminal), with a line per run, JSON for scripts, and the cancelled runs
shown by `status`, `runs` and `start --wait`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from psycopg.types.json import Jsonb

from pgflow_gen import cli
from tests.e2e.harness import Db, answered, run_cli


def start(db: Db, hours_ago: int = 0) -> uuid.UUID:
    run_id = db.start("e2ePlain", {"name": "Ada"})
    db.conn.execute(
        "update pgflow.runs set started_at = now() - make_interval(hours => %s) where run_id = %s",
        (hours_ago, run_id),
    )
    return run_id


def test_cancel_by_run_id_says_so_and_status_and_runs_show_it(
    plain: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = start(plain)
    code, out, err = run_cli(capsys, db_url, "cancel", str(run_id), "--reason", "a typo", "--yes")
    assert (code, out, err) == (0, f"cancelled run {run_id} of e2ePlain\n", "")

    code, out, _ = run_cli(capsys, db_url, "status", str(run_id))
    assert code == 0
    assert "status:  cancelled\n" in out
    assert "reason:  a typo\n" in out
    assert "ended:   " in out
    code, out, _ = run_cli(capsys, db_url, "status", str(run_id), "--format", "json")
    run = json.loads(out)["run"]
    assert (run["status"], run["cancel_reason"]) == ("cancelled", "a typo")
    assert run["cancelled_at"] is not None
    code, out, _ = run_cli(capsys, db_url, "runs", "--status", "cancelled", "--format", "json")
    [listed] = json.loads(out)["runs"]
    assert (listed["run_id"], listed["cancel_reason"]) == (str(run_id), "a typo")
    assert listed["ended_at"] is not None
    code, out, _ = run_cli(capsys, db_url, "runs", "--status", "cancelled")
    assert "error or reason" in out.splitlines()[0]
    assert "cancelled" in out.splitlines()[2]
    assert out.splitlines()[2].rstrip().endswith("a typo")


def test_cancel_by_flow_takes_only_started_runs_older_than_the_age(
    plain: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    old, older = start(plain, hours_ago=2), start(plain, hours_ago=3)
    young = start(plain)
    finished = start(plain, hours_ago=5)
    plain.call("cancel_run", finished, "earlier")

    code, out, _ = run_cli(
        capsys, db_url, "cancel", "--flow", "e2ePlain", "--older-than", "1h", "--yes",
        "--format", "json",
    )  # fmt: skip
    assert code == 0
    assert json.loads(out) == {
        "cancelled": [
            {"run_id": str(older), "flow_slug": "e2ePlain"},
            {"run_id": str(old), "flow_slug": "e2ePlain"},
        ],
        "not_cancelled": [],
    }
    assert plain.run(young)["status"] == "started"
    assert plain.run(finished)["cancel_reason"] == "earlier"

    code, out, _ = run_cli(capsys, db_url, "cancel", "--flow", "e2ePlain", "--older-than", "1h",
                           "--yes")  # fmt: skip
    assert (code, out) == (0, "no started run of e2ePlain to cancel\n")


def test_runs_that_are_not_started_are_errors_and_the_others_are_cancelled(
    plain: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    done, live, missing = start(plain), start(plain), uuid.uuid4()
    plain.call("cancel_run", done)
    code, out, err = run_cli(capsys, db_url, "cancel", str(done), str(live), str(missing), "--yes")
    assert code == 1
    assert out == f"cancelled run {live} of e2ePlain\n"
    assert err.splitlines() == [
        f"error: run {done} is cancelled already; only a started run can be cancelled",
        f"error: run {missing} does not exist; only a started run can be cancelled",
    ]
    assert plain.run(live)["status"] == "cancelled"


def test_without_a_terminal_to_ask_on_nothing_is_cancelled(
    plain: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = start(plain)
    code, out, err = run_cli(capsys, db_url, "cancel", "--flow", "e2ePlain")
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "error: cancel would cancel 1 run and asks first, but there is no terminal to ask on.",
        "HINT: Pass --yes to cancel without asking.",
    ]
    assert plain.run(run_id)["status"] == "started"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "error: Name the runs to cancel, or a flow with --flow, not both."),
        ([str(uuid.uuid4()), "--flow", "e2ePlain"],
         "error: Name the runs to cancel, or a flow with --flow, not both."),
        (["--flow", "e2ePlian"], 'error: No flow "e2ePlian" is compiled in this database.'),
    ],
    ids=["nothing", "both", "unknown-flow"],
)  # fmt: skip
def test_a_wrong_selection_is_a_usage_error(
    plain: Db, db_url: str, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = run_cli(capsys, db_url, "cancel", *args)
    assert (code, out) == (2, "")
    assert err.splitlines()[0] == message


def test_a_bad_age_is_refused_by_the_parser(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["cancel", "--flow", "x", "--older-than", "an hour", "--database-url", db_url])
    assert exited.value.code == 2
    assert "invalid age 'an hour': write a number and a unit, for example 30s, 15m, 1h or 2d" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(("answer", "code", "status"), [("y", 0, "cancelled"), ("n", 2, "started")])
def test_on_a_terminal_it_shows_the_runs_and_asks(
    plain: Db, db_url: str, answer: str, code: int, status: str
) -> None:
    run_id = start(plain)
    exit_code, text = answered(db_url, answer, "cancel", str(run_id), "--reason", "testing")
    assert exit_code == code, text
    assert str(run_id) in text.split("[y/N]")[0]
    assert "cancel this run (testing)? [y/N] " in text
    tail = text.split("[y/N] ", 1)[1]
    if answer == "y":
        assert f"cancelled run {run_id} of e2ePlain" in tail
    else:
        assert "error: Nothing was cancelled." in tail
    assert plain.run(run_id)["status"] == status


def test_start_wait_ends_with_the_cancellation_and_its_reason(plain: Db, db_url: str) -> None:
    env = {**os.environ, "PGFLOW_DATABASE_URL": db_url}
    waiting = subprocess.Popen(
        [sys.executable, "-m", "pgflow_gen.cli", "start", "e2ePlain", "--input",
         '{"name": "Ada"}', "--wait"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=Path.cwd(),
    )  # fmt: skip
    assert waiting.stdout is not None
    first = waiting.stdout.readline()
    assert first.startswith("started run ")
    run_id = uuid.UUID(first.split()[2])
    plain.call("cancel_run", run_id, "changed my mind")
    out, _ = waiting.communicate(timeout=60)
    assert waiting.returncode == 1
    assert out.splitlines() == [
        "cancelled: changed my mind",
        f"(the run and every step: pgflow-gen status {run_id})",
    ]


def test_start_with_a_key_starts_one_run_and_then_names_it(
    plain: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ("start", "e2ePlain", "--input", '{"name": "Ada"}', "--key", "order-7")
    code, out, _ = run_cli(capsys, db_url, *args)
    assert code == 0
    assert out.startswith("started run ")
    run_id = out.split()[2]
    code, out, _ = run_cli(capsys, db_url, *args)
    assert (code, out) == (
        0, f"run {run_id} of e2ePlain has the key 'order-7' already (started); nothing started\n",
    )  # fmt: skip
    code, out, _ = run_cli(capsys, db_url, *args, "--format", "json")
    assert json.loads(out) == {
        "run_id": run_id, "flow_slug": "e2ePlain", "status": "started", "created": False,
    }  # fmt: skip
    assert plain.value("select count(*) from pgflow.runs") == 1


def test_pause_and_resume_a_step_and_every_listing_shows_the_pause(
    plain: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = start(plain)
    plain.conn.execute(
        "select pgflow.register_worker(gen_random_uuid(), 'e2eplain', 'e2ePlain', 'e2ePlain')"
    )
    code, out, _ = run_cli(capsys, db_url, "pause", "e2ePlain", "wrap_up", "--reason", "API down")
    assert (code, out) == (
        0, "paused step wrap_up of e2ePlain (API down): its tasks wait until"
        " `pgflow-gen resume e2ePlain wrap_up`\n",
    )  # fmt: skip

    code, out, _ = run_cli(capsys, db_url, "coverage", "--format", "json")
    routes = {r["step_slug"]: r["paused"] for r in json.loads(out)["routes"]}
    assert routes["shout"] is None
    assert routes["wrap_up"] is not None
    assert routes["wrap_up"]["reason"] == "API down"
    code, out, _ = run_cli(capsys, db_url, "coverage")
    header, _, shout, wrap_up = out.splitlines()[:4]
    assert header.split()[-1] == "paused"
    assert wrap_up.rstrip().endswith("paused: API down")
    assert not shout.rstrip().endswith("down")
    code, out, _ = run_cli(capsys, db_url, "status", str(run_id), "--format", "json")
    steps = {s["step_slug"]: s for s in json.loads(out)["steps"]}
    assert steps["wrap_up"]["paused"]["reason"] == "API down"
    assert steps["wrap_up"]["note"] == "paused: API down"
    assert steps["shout"]["paused"] is None
    code, out, _ = run_cli(capsys, db_url, "workers", "--format", "json")
    [worker] = json.loads(out)["workers"]
    assert worker["paused_steps"] == ["wrap_up"]
    code, out, _ = run_cli(capsys, db_url, "workers")
    assert out.splitlines()[0].rstrip().endswith("paused steps")

    code, out, _ = run_cli(capsys, db_url, "resume", "e2ePlain", "wrap_up", "--format", "json")
    assert json.loads(out) == {
        "flow_slug": "e2ePlain", "step_slug": "wrap_up", "was_paused": True,
        "held_messages_shown": 0,
    }  # fmt: skip
    code, out, _ = run_cli(capsys, db_url, "resume", "e2ePlain", "wrap_up")
    assert (code, out) == (0, "step wrap_up of e2ePlain was not paused; nothing changed\n")
    code, out, _ = run_cli(capsys, db_url, "coverage")
    assert "paused" not in out  # the column only shows while a step is paused


def test_pausing_an_unknown_step_names_a_near_one(
    plain: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, db_url, "pause", "e2ePlain", "wrapUp")
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        'error: Flow "e2ePlain" has no step "wrapUp".',
        'HINT: Did you mean "wrap_up"? Slugs are exact. Steps of e2ePlain: shout, wrap_up.',
    ]
    assert plain.value("select count(*) from pgflow.step_pauses") == 0


def start_as(db: Db, run_id: str) -> uuid.UUID:
    row = db.conn.execute(
        "select run_id from pgflow.start_flow('e2ePlain', %s, %s)",
        (Jsonb({"name": "Ada"}), uuid.UUID(run_id)),
    ).fetchone()
    assert row is not None
    found: uuid.UUID = row[0]
    return found


def test_run_commands_take_the_first_8_characters_of_an_id(
    plain: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    one = start_as(plain, "12345678-0000-4000-8000-000000000001")
    twins = [start_as(plain, f"abcdef12-0000-4000-8000-00000000000{n}") for n in (1, 2)]

    code, out, _ = run_cli(capsys, db_url, "status", "12345678")
    assert (code, out.splitlines()[0]) == (0, f"run:     {one}")
    code, out, err = run_cli(capsys, db_url, "cancel", "1234-5678", "--yes")
    assert (code, err) == (0, "")
    assert plain.run(one)["status"] == "cancelled"

    # A prefix two runs share names neither: it lists them and does nothing.
    code, out, err = run_cli(capsys, db_url, "cancel", "abcdef12", "--yes")
    lines = err.splitlines()
    assert (code, out, lines[0]) == (
        2, "", "error: 2 runs have ids that start with abcdef12; nothing was done.",
    )  # fmt: skip
    assert lines[1].startswith("DETAIL: ")
    assert {str(t) for t in twins} == {lines[1].split()[1], lines[2].split()[0]}
    assert lines[-1] == "HINT: Give more characters of the id (or the whole id)."
    assert {plain.run(t)["status"] for t in twins} == {"started"}

    code, _, err = run_cli(capsys, db_url, "status", "deadbeef")
    assert (code, err) == (1, "error: No run id starts with deadbeef.\n")
    with pytest.raises(SystemExit) as refused:
        run_cli(capsys, db_url, "retry", "abc")
    assert refused.value.code == 2
    assert (
        "invalid run id 'abc': give the whole id, or its first 8 characters or more"
        in capsys.readouterr().err
    )

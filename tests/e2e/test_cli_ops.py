"""The operations commands against live worker processes: start, status, runs, workers, coverage."""

from __future__ import annotations

import datetime
import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from pgflow_gen import cli
from tests.e2e.harness import PROJECT, Db, Workers
from tests.e2e.project.app.pgflow import e2e_plain


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
    assert "3 of 3 routes covered" in out
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


def json_of(capsys: pytest.CaptureFixture[str], db_url: str, *args: str) -> tuple[int, Any]:
    """Run a command with --format json: its stdout is one JSON document (progress goes to
    stderr)."""
    code = cli.main([*args, "--database-url", db_url])
    return code, json.loads(capsys.readouterr().out)


def test_every_listing_speaks_json_with_its_documented_schema(
    workers: Workers, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    workers.start("e2e_plain", "worker").started()
    code, started = json_of(
        capsys, db_url, "start", "e2ePlain", "--input", '{"name": "ada"}', "--wait",
        "--format", "json",
    )  # fmt: skip
    assert code == 0
    run_id = started["run_id"]
    assert started == {
        "run_id": run_id, "flow_slug": "e2ePlain", "status": "completed", "created": True,
        "output": {"wrap_up": "ADA!"}, "cancel_reason": None, "failure": None,
    }  # fmt: skip
    uuid.UUID(run_id)

    # The global option before the command, after it, and after its positional argument.
    for args in (("--format", "json", "status", run_id), ("status", "--format", "json", run_id),
                 ("status", run_id, "--format", "json")):  # fmt: skip
        code, status = json_of(capsys, db_url, *args)
        assert code == 0
        assert status["run"]["status"] == "completed"
    assert status["run"]["input"] == {"name": "ada"}
    assert datetime.datetime.fromisoformat(status["run"]["started_at"]).tzinfo is not None
    assert [(s["step_slug"], s["status"], s["queue_name"], s["tasks"], s["attempts"],
             s["last_error"]) for s in status["steps"]] == [
        ("shout", "completed", "e2eplain", 1, 1, None),
        ("wrap_up", "completed", "e2eplain", 1, 1, None),
    ]  # fmt: skip

    code, runs = json_of(capsys, db_url, "runs", "--format", "json", "--flow", "e2ePlain")
    assert code == 0
    [run] = runs["runs"]
    assert run | {"started_at": None, "ended_at": None} == {
        "run_id": run_id, "flow_slug": "e2ePlain", "status": "completed", "started_at": None,
        "ended_at": None, "failed_step": None, "error": None, "cancel_reason": None,
        "waiting_for_signals": [], "parent_run_id": None,
    }  # fmt: skip

    code, listed = json_of(capsys, db_url, "--format", "json", "workers")
    assert code == 0
    [worker] = listed["workers"]
    assert (worker["name"], worker["state"], worker["queue_name"], worker["step_slug"]) == (
        "e2ePlain", "live", "e2eplain", None,
    )  # fmt: skip

    code, flows = json_of(capsys, db_url, "flows", "--flow", "e2ePlain", "--format", "json")
    assert code == 0
    assert [(s["step_slug"], s["options"]["timeout"]) for s in flows["steps"]] == [
        ("shout", {"value": 60, "from_flow": True}),
        ("wrap_up", {"value": 60, "from_flow": True}),
    ]

    code, alone = json_of(capsys, db_url, "start", "e2ePlain", "--input", '{"name": "b"}',
                          "--format", "json")  # fmt: skip
    assert (code, alone["status"], alone["flow_slug"]) == (0, "started", "e2ePlain")


def test_a_format_a_command_does_not_have_is_a_usage_error(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as raised:  # argparse's own usage error
        run_cli(capsys, db_url, "runs", "--format", "dot")
    assert raised.value.code == 2
    assert "invalid choice: 'dot' (choose from 'table', 'json')" in capsys.readouterr().err
    code, out = run_cli(capsys, db_url, "--format", "dot", "workers")
    assert (code, out.splitlines()[0]) == (
        2, "error: --format dot is not a format of pgflow-gen workers.",
    )  # fmt: skip


def test_start_reports_bad_input_and_unknown_flows(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = run_cli(capsys, db_url, "start", "e2ePlain", "--input", "{nope")
    assert (code, out.splitlines()[0]) == (2, "error: --input is not JSON: Expecting property"
                                           " name enclosed in double quotes: line 1 column 2"
                                           " (char 1)")  # fmt: skip


def test_start_input_errors_show_an_input_of_the_flow(
    db: Db, db_url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # e2eCapped's input is {seconds: number}: the hints show that, not another flow's.
    db.conn.execute((PROJECT / "app" / "pgflow" / "migrations" / "e2eCapped.sql").read_text())
    code, out = run_cli(capsys, db_url, "start", "e2eCapped", "--input", "{seconds: 1}")
    assert (code, out.splitlines()[-1]) == (
        2, "HINT: For example --input '{\"seconds\": 1}' (an input of e2eCapped).",
    )  # fmt: skip
    code, out = run_cli(capsys, db_url, "start", "e2eCapped", "--input", '{"seconds": "1"}')
    assert (code, out.splitlines()) == (2, [
        'error: Invalid input for flow "e2eCapped": $.seconds: expected number, got string.',
        "DETAIL: $.seconds: expected number, got string",
        "HINT: The input must match the flow's input schema (the `input` of its spec). For"
        " example --input '{\"seconds\": 1}'.",
    ])  # fmt: skip
    lines = tmp_path / "inputs.jsonl"
    lines.write_text('{"seconds": 1}\n{seconds}\n')
    code, out = run_cli(capsys, db_url, "start", "e2eCapped", "--inputs", str(lines))
    assert (code, out.splitlines()[-1]) == (
        2, 'HINT: Each line holds one run input, such as {"seconds": 1}.',
    )  # fmt: skip
    assert db.value("select count(*) from pgflow.runs") == 0


def test_a_failed_run_makes_start_wait_say_where_and_why_and_exit_1(
    workers: Workers, db: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for entry in ("first", "second", "side"):
        workers.start("e2e_steps", entry).started()
    code, out = run_cli(
        capsys, db_url, "start", "e2eSteps", "--input", '{"n": 1, "fail_first": 9}', "--wait"
    )
    assert code == 1
    run_id = out.split()[2]
    # stdout, then stderr's progress lines (one every 10 s without a terminal)
    lines = [line for line in out.splitlines() if not line.startswith("waiting for run ")]
    failed = lines.index(
        'failed: step "first" task 0, attempt 4: RuntimeError: planned failure on attempt 4'
    )
    assert lines[failed + 1] == "  Traceback (most recent call last):"
    assert lines[-2] == "  RuntimeError: planned failure on attempt 4"
    assert lines[-1] == f"(the run and every step: pgflow-gen status {run_id})"
    assert db.value("select count(*) from pgflow.runs where status = 'failed'") == 1

    code, out = run_cli(capsys, db_url, "status", run_id)
    assert code == 0
    rows = {
        line.split()[0]: line.split()
        for line in out.splitlines()
        if line.startswith(("first ", "second ", "side "))
    }
    assert rows["first"][:5] == ["first", "failed", "e2esteps__first", "1", "4"]
    assert " ".join(rows["first"][5:]) == "RuntimeError: planned failure on attempt 4"
    assert out.split("last errors:\n", 1)[1].splitlines()[:2] == [
        '  step "first" task 0, attempt 4 (failed): RuntimeError: planned failure on attempt 4',
        "    Traceback (most recent call last):",
    ]

    code, out = run_cli(capsys, db_url, "runs", "--status", "failed")
    assert code == 0
    [row] = [line for line in out.splitlines() if line.startswith(run_id)]
    assert row.split()[2] == "failed"
    assert row.endswith("first        RuntimeError: planned failure on attempt 4")
    code, out = run_cli(capsys, db_url, "runs", "--status", "completed")
    assert run_id not in out


def test_start_wait_says_at_once_which_step_has_no_worker_and_how_to_start_it(
    workers: Workers,
    db: Db,
    db_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(PROJECT)  # where the generated Procfile is found
    workers.start("e2e_steps", "first").started()
    workers.start("e2e_steps", "side").started()
    code, out = run_cli(
        capsys, db_url, "start", "e2eSteps", "--input", '{"n": 1}', "--wait", "--timeout", "5"
    )
    assert code == 1
    assert (
        'warning: step "second" has 1 queued task and no live worker on queue'
        " e2esteps__second; start it with"
        " `python -m app.pgflow.workers.e2e_steps.second`"
    ) in out
    assert out.count("warning:") == 1  # once per step, and only for the unserved one
    assert "is still running after 5 s." in out


def compile_plain(db: Db) -> None:
    flow = e2e_plain.FLOW
    db.value("select pgflow.ensure_flow_compiled(%s, %s)", flow.slug, Jsonb(flow.shape()))


def test_start_of_a_flow_that_is_not_compiled_is_a_typed_error(
    db: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = run_cli(capsys, db_url, "start", "missingFlow")
    assert code == 2  # a usage error, as docs/errors.md says
    [error, hint] = out.splitlines()
    assert error == 'error: No flow "missingFlow" is compiled in this database.'
    assert hint.startswith("HINT: Compiled flows: ")
    compile_plain(db)
    code, out = run_cli(capsys, db_url, "start", "e2ePlian")
    assert code == 2
    assert out.splitlines()[1].startswith(
        'HINT: Did you mean "e2ePlain"? Slugs are exact. Compiled flows: '
    )


def test_commands_on_a_database_without_the_engine_say_to_migrate(
    empty_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in (["start", "e2ePlain"], ["runs"], ["workers"], ["coverage"]):
        code, out = run_cli(capsys, empty_db_url, *command)
        assert code == 1, command
        assert out.splitlines() == [
            "error: The database has no pgflow engine (or an older one).",
            "DETAIL: It has no engine migrations (pgflow.schema_migrations).",
            "HINT: Run `pgflow-gen db migrate` against this database first.",
        ], command


def test_commands_on_an_engine_older_than_the_support_window_say_to_migrate(
    db: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db.conn.execute("delete from pgflow.schema_migrations where version >= '0020'")
    for command in (["runs"], ["workers"], ["limits"], ["schedules"], ["flows"]):
        code, out = run_cli(capsys, db_url, *command)
        assert code == 1, command
        assert out.splitlines() == [
            "error: The database has no pgflow engine (or an older one).",
            "DETAIL: Its engine is at migration 0019; this release works with migration 0020"
            " and later.",
            "HINT: Run `pgflow-gen db migrate` against this database first.",
        ], command


def test_status_names_the_attempt_each_last_error_came_from(
    db: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db.flow("retried", {"slug": "only"}, max_attempts=3, base_delay=0)
    run_id = db.start("retried")
    [first] = db.poll("retried")
    db.fail(first, "RuntimeError: attempt one broke")
    [second] = db.poll("retried")  # attempt 2 runs now; the error is attempt 1's
    assert second.attempt == 2
    code, out = run_cli(capsys, db_url, "status", str(run_id))
    assert code == 0
    assert out.split("last errors:\n", 1)[1].splitlines()[0] == (
        '  step "only" task 0, attempt 1 (started): RuntimeError: attempt one broke'
    )
    db.fail(second, "RuntimeError: attempt two broke")
    code, status = json_of(capsys, db_url, "status", str(run_id), "--format", "json")
    assert status["steps"][0]["last_error"] == {
        "task_index": 0, "attempt": 2, "task_status": "queued",
        "error": "RuntimeError: attempt two broke",
    }  # fmt: skip


def test_status_of_a_run_that_recovered_says_so_and_offers_no_signal(
    db: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A run whose step failed while its signal step waited: it failed, and waits for nothing.
    db.flow("gated", {"slug": "approval", "step_type": "signal"}, {"slug": "charge"},
            max_attempts=1, base_delay=0)  # fmt: skip
    run_id = db.start("gated")
    [charge] = db.poll("gated")
    db.fail(charge, "RuntimeError: card declined")
    assert db.run(run_id)["status"] == "failed"
    code, out = run_cli(capsys, db_url, "status", str(run_id))
    assert code == 0
    assert "status:  failed\n" in out
    assert "waiting for a signal" not in out
    assert "pgflow-gen signal" not in out
    [approval_line] = [line for line in out.splitlines() if line.startswith("approval ")]
    assert approval_line.split()[1] == "started"  # as the engine left it, but it waits no more
    assert approval_line.endswith("the run is failed: nothing more runs here")
    assert out.splitlines()[-1] == (
        f"retry it from where it failed: pgflow-gen retry {str(run_id).replace('-', '')[:8]}"
    )
    code, status = json_of(capsys, db_url, "status", str(run_id), "--format", "json")
    assert status["waiting_for_signals"] == []
    # A signal to it is refused with the command that helps, not an SQL function.
    code = cli.main(["signal", str(run_id), "approval", "--payload", "true",
                     "--database-url", db_url])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1
    assert err.splitlines()[-1] == (
        f"HINT: Nothing was changed. Retry the run first (`pgflow-gen retry {run_id}`), then"
        " send the signal."
    )
    assert "pgflow.retry_run" not in err

    # Retried, it completes: the error it recovered from says so, and no step's note repeats it.
    db.call("retry_run", run_id)
    [charge] = db.poll("gated")
    db.complete(charge, {"paid": True})
    db.call("send_signal", run_id, "approval", {"ok": True})
    assert db.run(run_id)["status"] == "completed"
    code, out = run_cli(capsys, db_url, "status", str(run_id))
    [charge_line] = [line for line in out.splitlines() if line.startswith("charge ")]
    assert "card declined" not in charge_line
    assert out.split("last errors:\n", 1)[1].splitlines()[0] == (
        '  step "charge" task 0, attempt 1 (then completed on attempt 2): RuntimeError: card'
        " declined"
    )

    # The runs list says what a running run waits for.
    waiting = db.start("gated")
    code, out = run_cli(capsys, db_url, "runs", "--flow", "gated")
    [row] = [line for line in out.splitlines() if line.startswith(str(waiting))]
    assert row.endswith("waiting for a signal: approval")
    code, runs = json_of(capsys, db_url, "runs", "--flow", "gated", "--format", "json")
    assert [r["waiting_for_signals"] for r in runs["runs"]] == [["approval"], []]


def test_ctrl_c_during_start_wait_says_the_run_goes_on_and_how_to_follow_it(
    db: Db, db_url: str
) -> None:
    # No worker runs: the run waits for one, and so does `start --wait`.
    compile_plain(db)
    command = [sys.executable, "-m", "pgflow_gen.cli", "start", "e2ePlain", "--input",
               '{"name": "ada"}', "--wait", "--database-url", db_url]  # fmt: skip
    with subprocess.Popen(
        command, cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as waiting:
        try:
            assert waiting.stdout is not None
            started = waiting.stdout.readline()  # printed once Ctrl-C is handled
            run_id = db.value("select run_id from pgflow.runs")
            waiting.send_signal(signal.SIGINT)
            rest, err = waiting.communicate(timeout=30)
            out = started + rest
        finally:
            if waiting.poll() is None:
                waiting.kill()
    assert waiting.returncode == 130
    assert out == f"started run {run_id} of e2ePlain\n"
    assert err.rstrip("\n").splitlines()[-1] == (
        f"stopped waiting; run {run_id} keeps going: follow it with `pgflow-gen status {run_id}`"
    )
    assert "Traceback" not in err
    assert db.value("select status from pgflow.runs") == "started"

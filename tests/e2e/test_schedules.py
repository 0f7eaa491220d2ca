"""Schedules end to end: five worker processes, started from the generated entry file of a flow
with a schedule every second, race for the same slots and start each once, and the runs
complete; `pgflow-gen schedules` lists the schedule with its last run, pauses and resumes it."""

from __future__ import annotations

import datetime
import json
import re

import pytest

from tests.e2e.harness import PROJECT, Db, Workers, eventually, run_cli

MIGRATION = "app/pgflow/migrations/e2eScheduled.sql"


def test_five_workers_start_each_slot_of_a_schedule_once(workers: Workers, db: Db) -> None:
    started = [workers.start("e2e_scheduled", "worker").started() for _ in range(5)]

    def five_runs() -> list[str] | None:
        keys = [
            row[0]
            for row in db.conn.execute(
                "select idempotency_key from pgflow.runs where flow_slug = 'e2eScheduled'"
            )
        ]
        return keys if len(keys) >= 5 else None

    keys = eventually(five_runs, "five scheduled runs")
    assert len(keys) == len(set(keys))  # one run per slot
    slots = sorted(
        datetime.datetime.fromisoformat(key.removeprefix("schedule:everySecond:")) for key in keys
    )
    assert all(slot.microsecond == 0 for slot in slots)  # whole seconds, the cron's slots
    for worker in started:
        assert worker.stop() == 0
        assert "Traceback" not in worker.log()
    # Every run started before the workers stopped was run by them or waits, none twice.
    assert db.value("select count(*) from pgflow.runs where status = 'failed'") == 0
    assert db.value("select input from pgflow.runs where flow_slug = 'e2eScheduled' limit 1") == {
        "n": 7
    }


def test_the_cli_lists_pauses_and_resumes_a_schedule(
    db: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db.conn.execute((PROJECT / MIGRATION).read_text())
    code, out, _ = run_cli(capsys, db_url, "schedules", "--format", "json")
    [schedule] = json.loads(out)["schedules"]
    assert (schedule["flow_slug"], schedule["schedule_name"], schedule["cron"]) == (
        "e2eScheduled", "everySecond", "* * * * * *",
    )  # fmt: skip
    assert schedule["next_run_at"] is not None
    code, out, _ = run_cli(capsys, db_url, "schedules")
    header, _, row = out.splitlines()
    assert header.split()[:2] == ["flow", "schedule"]
    assert row.startswith("e2eScheduled  everySecond")

    code, out, _ = run_cli(capsys, db_url, "schedules", "pause", "e2eScheduled", "everySecond")
    assert (code, out) == (
        0, "paused schedule everySecond of e2eScheduled: it starts no run until"
        " `pgflow-gen schedules resume e2eScheduled everySecond`\n",
    )  # fmt: skip
    code, out, _ = run_cli(capsys, db_url, "schedules", "--format", "json")
    assert json.loads(out)["schedules"][0]["next_run_at"] is None
    code, out, _ = run_cli(capsys, db_url, "schedules", "resume", "e2eScheduled", "everySecond")
    assert code == 0
    assert out.startswith("resumed schedule everySecond of e2eScheduled: its next run is at ")


def test_the_next_run_shows_in_the_schedules_time_zone_with_its_name(
    db: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    nightly = {"name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Paris", "input": {},
               "catchUp": "latest"}  # fmt: skip
    db.compile("reports", [{"slug": "build"}], options={}, schedules=[nightly])
    code, out, _ = run_cli(capsys, db_url, "schedules")
    header, _, row = out.splitlines()
    at = header.index("next run")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d 03:00 Europe/Paris", row[at:].split("  ")[0]), row
    assert run_cli(capsys, db_url, "schedules", "pause", "reports", "nightly")[0] == 0
    code, out, _ = run_cli(capsys, db_url, "schedules", "resume", "reports", "nightly")
    assert code == 0
    assert re.fullmatch(
        r"resumed schedule nightly of reports: its next run is at \d{4}-\d\d-\d\d 03:00"
        r" Europe/Paris\n",
        out,
    ), out


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["schedules", "pause", "e2eScheduled"], "error: Name the flow and the schedule to pause."),
        (["schedules", "pause", "e2eScheduled", "everysecond"],
         'error: Flow "e2eScheduled" has no schedule "everysecond".'),
        (["schedules", "resume", "nope", "x"], 'error: No flow "nope" is compiled'),
        (["schedules", "list", "e2eScheduled"], "error: `schedules` lists every schedule"),
    ],
    ids=["no-name", "wrong-case", "unknown-flow", "flow-without-action"],
)  # fmt: skip
def test_cli_mistakes_are_one_line_and_exit_2(
    db: Db, db_url: str, capsys: pytest.CaptureFixture[str], args: list[str], error: str
) -> None:
    db.conn.execute((PROJECT / MIGRATION).read_text())
    code, out, err = run_cli(capsys, db_url, *args)
    assert (code, out) == (2, "")
    assert err.splitlines()[0].startswith(error), err
    assert "Traceback" not in err
    assert db.value("select count(*) from pgflow.schedules where paused_at is not null") == 0

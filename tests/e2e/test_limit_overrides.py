"""An operator's limits and pauses stay over the spec through worker starts and `db apply`
until `limits --reset` (engine 0023): an emergency throttle set with `pgflow-gen limits` is not
undone by a deploy, an autoscaled replica or a `dev` restart. Real worker processes from the
generated entry files; the CLI's outputs line by line."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from tests.e2e.harness import PROJECT, Db, Workers, run_cli

FLOW, STEP = "e2eCapped", "capped"  # its spec: max_in_flight 4


def limits(db: Db) -> list[dict[str, Any]]:
    return db.all(
        "select max_in_flight, rate_limit, set_by from pgflow.step_limits where flow_slug = %s",
        FLOW,
    )


def test_an_operators_limit_and_pause_stay_through_worker_starts_until_reset(
    workers: Workers, db: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert workers.start("e2e_capped", "capped").started().stop() == 0  # compiles the flow
    assert limits(db) == [{"max_in_flight": 4, "rate_limit": None, "set_by": "spec"}]

    code, out, err = run_cli(capsys, db_url, "limits", FLOW, STEP, "--max-in-flight", "2")
    override = db.one("select set_at, actor from pgflow.step_limit_overrides")
    at = override["set_at"].astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    assert (code, out.splitlines(), err.splitlines()) == (
        0,
        [
            f"step capped of e2eCapped: at most 2 in flight (0 now); an operator's, set by"
            f" {override['actor']} on {at}; the spec says at most 4 in flight"
        ],
        [
            "note: an operator's limits stay through worker starts and `pgflow-gen db apply`;"
            " `pgflow-gen limits e2eCapped capped --reset` gives the step the spec's again"
        ],
    )
    code, _, err = run_cli(capsys, db_url, "pause", FLOW, STEP, "--reason", "supplier down")
    assert (code, err) == (0, "")

    # A deploy: the flow's migration applied again, and a new worker started.
    code, out, _ = run_cli(capsys, db_url, "db", "apply", str(PROJECT / "app" / "pgflow"))
    assert code == 0
    assert "flow e2eCapped verified" in out
    worker = workers.start("e2e_capped", "capped").started()
    assert "options updated" not in worker.log()
    assert limits(db) == [{"max_in_flight": 2, "rate_limit": None, "set_by": "operator"}]
    assert db.value("select reason from pgflow.step_pauses") == "supplier down"

    code, out, _ = run_cli(capsys, db_url, "limits", FLOW)
    header, _, row = out.splitlines()
    assert header.split()[-3:] == ["by", "spec", "says"]  # "set by", "spec says"
    assert row.split()[:5] == ["e2eCapped", "capped", "e2ecapped__capped", "2", "0"]
    assert row.rstrip().endswith(f"operator ({override['actor']}, {at})  at most 4 in flight")

    code, out, err = run_cli(capsys, db_url, "limits", FLOW, STEP, "--reset")
    assert (code, out, err) == (
        0,
        "step capped of e2eCapped: at most 4 in flight (0 now); set by the spec\n",
        "",
    )
    assert limits(db) == [{"max_in_flight": 4, "rate_limit": None, "set_by": "spec"}]
    code, out, err = run_cli(capsys, db_url, "limits", FLOW, STEP, "--reset")
    assert (code, err) == (0, "note: no operator's limits to remove: these are the spec's\n")
    assert worker.stop() == 0
    assert "Traceback" not in worker.log()


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--reset", "--max-in-flight", "3"], "error: --reset gives the step the spec's limits"),
        (["--reset", "--clear"], "error: --reset gives the step the spec's limits"),
    ],
    ids=["reset-and-set", "reset-and-clear"],
)
def test_reset_with_a_new_limit_is_a_usage_error_changing_nothing(
    workers: Workers,
    db: Db,
    db_url: str,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    error: str,
) -> None:
    assert workers.start("e2e_capped", "capped").started().stop() == 0
    code, out, err = run_cli(capsys, db_url, "limits", FLOW, STEP, *args)
    assert (code, out) == (2, "")
    assert err.splitlines()[0].startswith(error)
    assert "Traceback" not in err
    assert limits(db) == [{"max_in_flight": 4, "rate_limit": None, "set_by": "spec"}]

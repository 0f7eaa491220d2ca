"""`pgflow-gen limits`: shows every limited step with its use, sets and clears a step's limits
live (keeping the one an option leaves out), and `status` and `coverage` show them; mistakes
are one line and exit 2, changing nothing."""

from __future__ import annotations

import json
import uuid

import pytest
from psycopg.types.json import Jsonb

from pgflow_gen import cli
from tests.e2e.harness import PROJECT, Db, run_cli


def start(db: Db) -> uuid.UUID:
    row = db.conn.execute(
        "select run_id from pgflow.start_flow('e2ePlain', %s)", (Jsonb({"name": "Ada"}),)
    ).fetchone()
    assert row is not None
    run_id: uuid.UUID = row[0]
    return run_id


def test_set_show_and_clear_a_steps_limits(
    plain: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(capsys, db_url, "limits")
    assert (code, out) == (0, "no step has limits\n")

    code, out, err = run_cli(
        capsys, db_url, "limits", "e2ePlain", "shout", "--max-in-flight", "4", "--rate", "100/1m"
    )
    assert (code, err) == (0, "")
    assert out == (
        "step shout of e2ePlain: at most 4 in flight (0 now), at most 100 starts per 60 s"
        " (0 in the last 60 s); set by the operator\n"
    )
    # An option left out keeps its limit; `none` clears one.
    code, out, _ = run_cli(capsys, db_url, "limits", "e2ePlain", "shout", "--rate", "none")
    assert out == "step shout of e2ePlain: at most 4 in flight (0 now); set by the operator\n"
    assert plain.conn.execute(
        "select max_in_flight, rate_limit, rate_period_s from pgflow.step_limits"
    ).fetchall() == [(4, None, None)]

    code, out, _ = run_cli(capsys, db_url, "limits", "--format", "json")
    shown = json.loads(out)
    limits = shown["steps"][0]["limits"]
    assert limits.pop("overridden_at") is not None  # when and by whom (engine 0023)
    assert limits.pop("overridden_by") == plain.value("select session_user")
    assert shown == {"steps": [{
        "flow_slug": "e2ePlain", "step_slug": "shout", "queue_name": "e2eplain",
        "limits": {"max_in_flight": 4, "in_flight": 0, "rate_limit": None,
                   "rate_period_s": None, "window_starts": 0, "set_by": "operator",
                   "spec_max_in_flight": None, "spec_rate_limit": None,
                   "spec_rate_period_s": None},
    }]}  # fmt: skip
    code, out, _ = run_cli(capsys, db_url, "limits", "e2ePlain")
    header, _, row = out.splitlines()
    assert header.split()[:3] == ["flow", "step", "queue"]
    assert row.split()[:5] == ["e2ePlain", "shout", "e2eplain", "4", "0"]

    run_id = start(plain)
    code, out, _ = run_cli(capsys, db_url, "status", str(run_id), "--format", "json")
    steps = {s["step_slug"]: s for s in json.loads(out)["steps"]}
    assert steps["shout"]["limits"]["max_in_flight"] == 4
    assert steps["shout"]["note"] == "limited: 0/4 in flight"
    assert steps["wrap_up"]["limits"] is None
    code, out, _ = run_cli(capsys, db_url, "coverage")
    header, _, shout, wrap_up = out.splitlines()[:4]
    assert header.split()[-1] == "limits"
    assert shout.rstrip().endswith("0/4 in flight")
    assert not wrap_up.rstrip().endswith("flight")

    code, out, _ = run_cli(capsys, db_url, "limits", "e2ePlain", "shout", "--clear")
    assert (code, out) == (0, "step shout of e2ePlain: no limits now\n")
    assert plain.value("select count(*) from pgflow.step_limits") == 0
    code, out, _ = run_cli(capsys, db_url, "coverage")
    assert "limits" not in out  # the column only shows while a step has limits


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["limits", "e2ePlain", "--max-in-flight", "4"], "error: Name the flow and the step"),
        (["limits", "e2ePlain", "shoot", "--max-in-flight", "4"],
         'error: Flow "e2ePlain" has no step "shoot".'),
        (["limits", "e2eplain"], 'error: No flow "e2eplain" is compiled in this database.'),
        (["limits", "e2ePlain", "shout", "--clear", "--rate", "1/s"], "error: --clear removes"),
    ],
    ids=["no-step", "unknown-step", "unknown-flow", "clear-and-set"],
)  # fmt: skip
def test_mistakes_are_one_line_and_exit_2_changing_nothing(
    plain: Db, db_url: str, capsys: pytest.CaptureFixture[str], args: list[str], error: str
) -> None:
    code, out, err = run_cli(capsys, db_url, *args)
    assert (code, out) == (2, "")
    assert err.splitlines()[0].startswith(error)
    assert "Traceback" not in err
    assert plain.value("select count(*) from pgflow.step_limits") == 0


@pytest.mark.parametrize(
    ("option", "value", "error"),
    [
        ("--max-in-flight", "0", "invalid cap '0': write a whole number from 1, or none"),
        ("--rate", "100", "invalid rate '100': write COUNT/PERIOD, for example 100/1m"),
        ("--rate", "0/1m", "invalid rate '0/1m': the count and the period must be at least 1"),
    ],
    ids=["zero-cap", "no-period", "zero-rate"],
)
def test_a_bad_value_is_refused_by_the_parser(
    plain: Db, db_url: str, capsys: pytest.CaptureFixture[str], option: str, value: str,
    error: str,
) -> None:  # fmt: skip
    with pytest.raises(SystemExit) as exited:
        cli.main(["limits", "e2ePlain", "shout", option, value, "--database-url", db_url])
    assert exited.value.code == 2
    assert error in capsys.readouterr().err
    assert plain.value("select count(*) from pgflow.step_limits") == 0


def test_a_signal_step_takes_no_limit_one_line_exit_1(
    db: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db.conn.execute((PROJECT / "app/pgflow/migrations/e2eApprovals.sql").read_text())
    code, out, err = run_cli(
        capsys, db_url, "limits", "e2eApprovals", "approval", "--max-in-flight", "1"
    )
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        'error: Step "approval" of flow "e2eApprovals" is a signal step: it runs no task, so'
        " there is nothing to limit.",
        "HINT: Limit the steps that depend on it instead.",
    ]
    assert db.value("select count(*) from pgflow.step_limits") == 0


def test_status_and_coverage_show_a_keyed_steps_keys(
    db: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db.conn.execute((PROJECT / "app/pgflow/migrations/e2eFair.sql").read_text())
    inputs = [Jsonb({"tenant": "a", "seconds": 0})] * 5 + [Jsonb({"tenant": "b", "seconds": 0})]
    [first, *_] = [
        r[0]
        for r in db.conn.execute(
            "select run_id from pgflow.start_flows('e2eFair', %s::jsonb[])", (inputs,)
        ).fetchall()
    ]

    code, out, _ = run_cli(capsys, db_url, "status", str(first), "--format", "json")
    assert code == 0
    [work] = json.loads(out)["steps"]
    assert work["note"] == (
        "limited: 2 per $.tenant: 2 keys in flight, 1 waiting (3 tasks, most for 'a')"
    )
    assert {k: work["limits"][k] for k in ("limit_per_key", "keys_waiting", "parked")} == {
        "limit_per_key": 2,
        "keys_waiting": 1,
        "parked": 3,
    }
    code, out, _ = run_cli(capsys, db_url, "coverage")
    assert code == 1  # no worker covers the route
    header, _, row = out.splitlines()[:3]
    assert header.split()[-1] == "limits"
    assert row.rstrip().endswith("1 waiting (3 tasks, most for 'a')")
    code, out, _ = run_cli(capsys, db_url, "limits", "e2eFair")
    header, _, row = out.splitlines()
    assert (code, "per key" in header) == (0, True)
    assert row.split()[:3] == ["e2eFair", "work", "e2efair__work"]
    assert "at most 2 per $.tenant (1 key waiting)" in row
    # An operator's cap on a keyed step comes with the key, and no note about the spec's caps.
    code, out, err = run_cli(capsys, db_url, "limits", "e2eFair", "work", "--max-in-flight", "5")
    assert (code, err) == (0, "")
    assert out == (
        "step work of e2eFair: at most 5 in flight (0 now), at most 2 per $.tenant"
        " (1 key waiting); set by the operator\n"
    )

"""`pgflow-gen fork`: what it refuses and says, without workers (the engine's calls play them):
a step the flow does not have, no terminal to ask on, a run it cannot fork, and a flow's failed
runs forked in bulk."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.e2e.harness import Db, run_cli


def failed_run(db: Db) -> uuid.UUID:
    run_id = db.start("forkable", {"n": 1})
    [first] = db.poll("forkable")
    db.complete(first, "one")
    [second] = db.poll("forkable")
    db.fail(second, "a bug")
    assert db.run(run_id)["status"] == "failed"
    return run_id


@pytest.fixture
def forkable(db: Db) -> Db:
    db.flow("forkable", {"slug": "first"}, {"slug": "second", "deps_slugs": ["first"]},
            max_attempts=1)  # fmt: skip
    return db


def test_mistakes_are_one_line_and_change_nothing(
    forkable: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = failed_run(forkable)

    code, out, err = run_cli(capsys, db_url, "fork", str(run_id), "--from", "secnd", "--yes")
    assert (code, out) == (2, "")
    assert err.startswith('error: Flow "forkable" has no step "secnd".')
    assert 'Did you mean "second"?' in err

    code, out, err = run_cli(capsys, db_url, "fork", str(run_id), "--from", "second")
    assert (code, out) == (2, "")
    assert err.startswith(
        "error: fork would start 1 run again from step second (their handlers run again) and"
        " asks first, but there is no terminal to ask on."
    )

    code, out, err = run_cli(capsys, db_url, "fork", "--from", "second")
    assert code == 2
    assert "Name the runs to fork, or a flow with --flow, not both." in err
    assert forkable.value("select count(*) from pgflow.runs") == 1


def test_a_run_that_cannot_be_forked_is_named_and_the_status_is_1(
    forkable: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = failed_run(forkable)
    forkable.call("add_step", "forkable", "third", deps_slugs=["second"])  # the flow changed

    code, out, err = run_cli(
        capsys, db_url, "fork", str(run_id), "--from", "second", "--yes", "--format", "json"
    )

    assert (code, err) == (1, "")
    assert json.loads(out) == {
        "forked": [],
        "not_forked": [{
            "run_id": str(run_id),
            "reason": f'Run {run_id} cannot be forked: flow "forkable" has changed since it'
            " started.",
        }],
    }  # fmt: skip


def test_every_failed_run_of_a_flow_forks_in_bulk(
    forkable: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    failed = [failed_run(forkable) for _ in range(2)]

    code, out, err = run_cli(
        capsys, db_url, "fork", "--flow", "forkable", "--failed-since", "1h", "--from", "second",
        "--yes", "--format", "json",
    )  # fmt: skip

    assert (code, err) == (0, "")
    forked = json.loads(out)["forked"]
    assert sorted(f["forked_from_run_id"] for f in forked) == sorted(str(r) for r in failed)
    assert {f["status"] for f in forked} == {"started"}
    [task] = forkable.poll("forkable", qty=1)
    assert task.step_slug == "second"

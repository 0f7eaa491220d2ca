"""Flows split across two databases (docs/scaling.md): each flow's workers and clients point at
its own database; runs of both complete, and each database knows only its own flow, runs and
workers, as `pgflow-gen coverage` and `runs` show when pointed at it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pgflow_gen import cli
from pgflow_gen.runtime import Client
from pgflow_gen.testing import clones
from tests.e2e.harness import Db, Workers
from tests.e2e.project.app.pgflow import e2e_plain, e2e_steps


@pytest.fixture
def other_url(admin_url: str, template_name: str) -> Iterator[str]:
    with clones.fresh_database(admin_url, template_name) as url:
        yield url


def test_two_flows_on_two_databases_run_side_by_side(
    db_url: str, other_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain_workers, step_workers = Workers(db_url, tmp_path), Workers(other_url, tmp_path)
    plain_db, steps_db = Db(db_url), Db(other_url)
    try:
        plain_workers.start("e2e_plain", "worker").started()
        for entry in ("first", "second", "side"):
            step_workers.start("e2e_steps", entry).started()

        with Client(db_url) as plain, Client(other_url) as steps:
            ada: e2e_plain.Input = {"name": "ada"}
            two: e2e_steps.Input = {"n": 2}
            [plain_run] = plain.start_flows(e2e_plain.FLOW, [ada])
            [steps_run] = steps.start_flows(e2e_steps.STEP_QUEUED_FLOW, [two])
            assert plain_run.wait(60).status == "completed"
            assert steps_run.wait(60).status == "completed"

        assert plain_db.all("select flow_slug from pgflow.flows") == [{"flow_slug": "e2ePlain"}]
        assert steps_db.all("select flow_slug from pgflow.flows") == [{"flow_slug": "e2eSteps"}]
        for url, flow in ((db_url, "e2ePlain"), (other_url, "e2eSteps")):
            assert cli.main(["coverage", "--database-url", url]) == 0  # every route covered here
            out = capsys.readouterr().out
            assert flow in out
            assert cli.main(["runs", "--format", "json", "--database-url", url]) == 0
            assert flow in capsys.readouterr().out
    finally:
        plain_workers.close()
        step_workers.close()
        plain_db.close()
        steps_db.close()

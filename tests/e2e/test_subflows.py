"""Subflows with worker processes started from the generated entry files: an order ships through
its shipping subflow; twenty documents run through a document flow, one failing its first
attempt and retried in place; cancelling a parent stops its children's handlers in flight."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import Db, Workers, eventually, run_cli


def children(db: Db, run_id: uuid.UUID) -> list[dict[str, Any]]:
    return db.all(
        "select * from pgflow.runs where parent_run_id = %s order by parent_task_index", run_id
    )


@pytest.fixture
def documents(workers: Workers, db: Db) -> Db:
    """Workers of e2eDocument (first: the child flow must be compiled before a parent's run
    starts one) and of e2eDocuments."""
    workers.start("e2e_document", "worker").started()
    workers.start("e2e_documents", "worker").started()
    return db


def test_an_order_ships_through_its_shipping_subflow(
    workers: Workers, db: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    workers.start("e2e_shipping", "worker").started()
    for step in ("check", "tell"):
        workers.start("e2e_orders", step).started()

    run_id = db.start("e2eOrders", {"order_id": 7, "address": " 1 Main St "})

    run = db.finished(run_id)
    assert (run["status"], run["output"]) == ("completed", {"tell": "order 7 shipped: T-7"})
    [child] = children(db, run_id)
    assert (child["flow_slug"], child["status"], child["input"]) == (
        "e2eShipping",
        "completed",
        {"address": "1 Main St", "order_id": 7},
    )
    assert db.task(run_id, "ship")["output"] == {
        "label": {"tracking": "T-7"}
    }  # the child's run output
    code, out, _ = run_cli(capsys, db_url, "status", str(run_id))
    assert code == 0
    assert f"subflow run {child['run_id']} of e2eShipping: completed" in out
    code, out, _ = run_cli(capsys, db_url, "flows", "--flow", "e2eOrders", "--format", "json")
    [ship] = [s for s in json.loads(out)["steps"] if s["step_slug"] == "ship"]
    assert (ship["step_type"], ship["subflow_slug"], ship["queue_name"]) == (
        "subflow",
        "e2eShipping",
        None,  # its route is reserved, but it has no queue
    )
    assert set(ship["options"]) == {"max_attempts", "base_delay"}
    code, out, _ = run_cli(capsys, db_url, "flows", "--flow", "e2eOrders")
    [line] = [line for line in out.splitlines() if " ship " in line]
    assert "subflow of e2eShipping" in line


def test_twenty_documents_each_run_a_subflow_and_a_failed_one_is_retried_in_place(
    documents: Db, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    names = [f"document number {n}" for n in range(20)]
    run_id = documents.start(
        "e2eDocuments", [{"name": name, "fail_once": name.endswith(" 13")} for name in names]
    )

    run = documents.finished(run_id)
    assert (run["status"], run["output"]) == ("completed", {"count": 20})
    assert documents.state(run_id, "each")["output"] == [
        {"store": f"{name}: 3 words"} for name in names
    ]
    kids = children(documents, run_id)
    assert [k["retry_count"] for k in kids] == [1 if n == 13 else 0 for n in range(20)]
    tasks = documents.tasks(run_id, "each")
    assert [t["attempts_count"] for t in tasks] == [2 if n == 13 else 1 for n in range(20)]
    assert tasks[13]["error_message"].startswith(
        f'Subflow run {kids[13]["run_id"]} of flow "e2eDocument" failed: step "parse":'
        " RuntimeError: planned failure of document number 13"
    )
    code, out, _ = run_cli(capsys, db_url, "status", str(run_id))
    assert code == 0
    listed = out.split("subflow runs:\n", 1)[1].splitlines()[:20]
    assert listed == [
        f"  each[{n}]: subflow run {kid['run_id']} of e2eDocument: completed"
        + (", retried 1 time" if n == 13 else "")
        for n, kid in enumerate(kids)
    ]
    code, out, _ = run_cli(capsys, db_url, "runs", "--parent", str(run_id)[:8], "--format", "json")
    assert code == 0
    assert sorted(r["run_id"] for r in json.loads(out)["runs"]) == sorted(
        str(kid["run_id"]) for kid in kids
    )


def test_cancelling_a_parent_stops_its_childrens_handlers_in_flight(
    documents: Db, workers: Workers, db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gate = tmp_path / "never"
    run_id = documents.start(
        "e2eDocuments", [{"name": f"held {n}", "gate": str(gate)} for n in range(3)]
    )
    eventually(
        lambda: documents.value(
            "select count(*) = 3 from pgflow.step_tasks t join pgflow.runs r using (run_id)"
            " where r.parent_run_id = %s and t.step_slug = 'parse' and t.status = 'started'",
            run_id,
        ),
        "the three children's handlers to start",
    )

    code, out, err = run_cli(capsys, db_url, "cancel", str(run_id), "--yes")

    assert (code, err) == (0, "")
    assert f"cancelled run {run_id}" in out
    assert documents.run(run_id)["status"] == "cancelled"
    kids = children(documents, run_id)
    assert {k["status"] for k in kids} == {"cancelled"}
    assert {k["cancel_reason"] for k in kids} == {f"Its parent run {run_id} was cancelled."}
    [child_worker, _parent_worker] = list(workers)

    def all_stopped() -> str | None:
        log = child_worker.log()
        return log if log.count("stopped: the run was cancelled") == 3 else None

    eventually(all_stopped, "the children's handlers to stop")
    assert (
        documents.value(
            "select count(*) from pgflow.step_tasks t join pgflow.runs r using (run_id)"
            " where r.parent_run_id = %s and t.status in ('queued', 'started')",
            run_id,
        )
        == 0
    )


def test_a_run_forked_from_its_failed_step_after_a_fix_runs_only_that_step_again(
    workers: Workers, db: Db, db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workers.start("e2e_document", "worker").started()
    bug = tmp_path / "bug"
    bug.touch()
    failed = db.finished(db.start("e2eDocument", {"name": "three little words", "bug": str(bug)}))
    assert failed["status"] == "failed"

    bug.unlink()  # the fix
    code, out, err = run_cli(
        capsys, db_url, "fork", str(failed["run_id"])[:8], "--from", "store", "--yes"
    )

    assert (code, err) == (0, "")
    [fork] = db.all(
        "select run_id from pgflow.runs where forked_from_run_id = %s", failed["run_id"]
    )
    assert out == (
        f"forked run {failed['run_id']} of e2eDocument from step store: new run"
        f" {fork['run_id']} (started)\n"
    )
    run = db.finished(fork["run_id"])
    assert (run["status"], run["output"]) == ("completed", {"store": "three little words: 3 words"})
    # parse was copied (no attempt of its own), store ran again.
    assert db.task(fork["run_id"], "parse")["attempts_count"] == 0
    assert db.task(fork["run_id"], "store")["attempts_count"] == 1
    assert db.run(failed["run_id"])["status"] == "failed"  # left as it was


def test_an_order_forked_from_its_middle_subflow_step_after_a_fix_ships_through_a_new_child(
    workers: Workers, db: Db, db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bug = tmp_path / "bug"
    bug.touch()
    workers.start("e2e_shipping", "worker", E2E_SHIPPING_BUG=str(bug)).started()
    for step in ("check", "tell"):
        workers.start("e2e_orders", step).started()
    failed = db.finished(db.start("e2eOrders", {"order_id": 8, "address": "2 High St"}))
    assert failed["status"] == "failed"
    [old_child] = children(db, failed["run_id"])
    assert old_child["status"] == "failed"

    bug.unlink()  # the fix
    code, out, err = run_cli(
        capsys, db_url, "fork", str(failed["run_id"]), "--from", "ship", "--yes"
    )

    assert (code, err) == (0, "")
    [fork] = db.all(
        "select run_id from pgflow.runs where forked_from_run_id = %s", failed["run_id"]
    )
    assert f"new run {fork['run_id']}" in out
    run = db.finished(fork["run_id"])
    assert (run["status"], run["output"]) == ("completed", {"tell": "order 8 shipped: T-8"})
    assert db.task(fork["run_id"], "check")["attempts_count"] == 0  # copied, not run again
    [new_child] = children(db, fork["run_id"])  # ship ran fresh: a new child run
    assert (new_child["status"], new_child["input"]) == (
        "completed",
        {"address": "2 High St", "order_id": 8},
    )
    assert db.run(old_child["run_id"])["status"] == "failed"  # the old tree is left as it was

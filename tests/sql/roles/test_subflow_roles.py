"""Subflows and least privilege (engine 0028): the engine starts and settles child runs as its
owner, so each step role keeps to its own step. A step role of the child completes the child and
with it the parent's task, without any right on the parent's steps; no role can complete a
subflow task by a report, and a plain worker cannot forge one either."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.engine import Engine
from tests.roles import Logins, refused

READ_AND_CLAIM = (
    "select run_id, step_slug, task_index, attempt, input"
    " from pgflow.read_and_claim(%s, %s, %s, 10, 30, %s)"
)


class StepWorker:
    """A connection as the step role of a flow's step, registered as a worker of it."""

    def __init__(self, logins: Logins, flow_slug: str, step_slug: str) -> None:
        made = {r.step_slug: r for r in logins.add_step_roles(flow_slug)}
        self.conn = logins.connect(made[step_slug].role)
        self.flow_slug, self.step_slug = flow_slug, step_slug
        self.queue = f"{flow_slug}__{step_slug}".lower()
        self.worker_id = uuid.uuid4()
        self.conn.execute(
            "select pgflow.register_worker(%s, %s, 'w', %s, %s)",
            (self.worker_id, self.queue, flow_slug, step_slug),
        )

    def claim(self) -> list[tuple[Any, ...]]:
        params = (self.flow_slug, self.queue, self.worker_id, self.step_slug)
        return self.conn.execute(READ_AND_CLAIM, params).fetchall()

    def complete(self, task: tuple[Any, ...], output: Any) -> None:
        self.conn.execute(
            "select pgflow.complete_task(%s, %s, %s, %s, %s)",
            (task[0], task[1], task[2], Jsonb(output), task[3]),
        )


def test_a_childs_step_role_completes_the_child_and_so_the_parents_task(
    engine: Engine, logins: Logins
) -> None:
    engine.compile("shipping", [{"slug": "label"}])
    engine.compile(
        "orders",
        [
            {"slug": "validate"},
            {
                "slug": "ship",
                "deps": ["validate"],
                "stepType": "subflow",
                "subflowSlug": "shipping",
            },
            {"slug": "notify", "deps": ["ship"]},
        ],
    )
    validator = StepWorker(logins, "orders", "validate")
    labeller = StepWorker(logins, "shipping", "label")
    run_id = engine.start("orders", {"order": 1})
    [task] = validator.claim()

    # validate's role starts a run of a flow it has no right on: the engine does it.
    validator.complete(task, {"to": "x"})

    [child] = engine.all("select run_id, input from pgflow.runs where parent_run_id = %s", run_id)
    assert child["input"] == {"to": "x"}
    [label] = labeller.claim()
    assert label[0] == child["run_id"]
    # label's role may not report on the parent's subflow task...
    assert refused(
        labeller.conn,
        "select pgflow.complete_task(%s, 'ship', 0, %s, 1)",
        run_id,
        Jsonb({"label": "forged"}),
    ).endswith('may not work on step "ship" of flow "orders".')
    labeller.conn.rollback()

    # ...but completing its own task completes the child, and the child the parent's task.
    labeller.complete(label, "L-9")

    assert engine.task(run_id, "ship")["output"] == {"label": "L-9"}
    [notify] = engine.all("select message from pgmq.q_orders__notify")
    assert notify["message"]["run_id"] == str(run_id)


def test_a_plain_worker_cannot_forge_a_subflow_tasks_result(engine: Engine, logins: Logins) -> None:
    engine.flow("shipping", {"slug": "label"})
    engine.flow("orders", {"slug": "ship", "step_type": "subflow", "subflow_slug": "shipping"})
    run_id = engine.start("orders", {})
    worker = logins.login("worker")

    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
        worker.execute(
            "select pgflow.complete_task(%s, 'ship', 0, %s, 1)",
            (run_id, Jsonb({"label": "forged"})),
        )

    assert engine.task(run_id, "ship")["status"] == "started"
    assert engine.run(run_id)["status"] == "started"

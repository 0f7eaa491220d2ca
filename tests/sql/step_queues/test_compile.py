"""ensure_flow_compiled with queue modes and route maps: provisioning, verification, mismatches,
local recompilation and its rollback, preflight collisions, and concurrent compilation."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.engine import Engine, shape_step

STEPS: list[dict[str, Any]] = [{"slug": "classify"}, {"slug": "deliverSlack", "deps": ["classify"]}]
QUEUES = ["threads__classify", "threads__deliverslack"]


def queues(engine: Engine) -> list[str]:
    return [r["queue_name"] for r in engine.all("select queue_name from pgmq.meta order by 1")]


def local(engine: Engine) -> None:
    engine.conn.execute("set pgflow.local = 'on'")


def test_step_mode_creates_exactly_its_step_queues_and_records_the_routes(engine: Engine) -> None:
    result = engine.compile("threads", STEPS)
    assert result == {"status": "compiled", "mismatchKind": None, "differences": []}
    assert queues(engine) == QUEUES
    assert engine.value("select queue_mode from pgflow.flows") == "step"
    routes = engine.all("select step_slug, step_index, queue_name from pgflow.steps order by 2")
    assert [(r["step_slug"], r["queue_name"]) for r in routes] == list(
        zip(["classify", "deliverSlack"], QUEUES, strict=True)
    )


def test_flow_mode_creates_the_default_queue_even_for_an_empty_flow(engine: Engine) -> None:
    assert engine.compile("Empty", [], mode="flow")["status"] == "compiled"
    assert queues(engine) == ["empty"]
    assert engine.value("select queue_mode from pgflow.flows") == "flow"


def test_an_empty_step_mode_flow_is_rejected_and_nothing_is_written(engine: Engine) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="has no steps"):
        engine.compile("empty", [], route_map=[])
    assert engine.value("select count(*) from pgflow.flows") == 0
    assert queues(engine) == []


def test_compiling_again_verifies_and_changes_nothing(engine: Engine) -> None:
    engine.compile("threads", STEPS)
    run_id = engine.start("threads")
    assert engine.compile("threads", STEPS)["status"] == "verified"
    assert queues(engine) == QUEUES
    assert engine.run(run_id)["status"] == "started"


@pytest.mark.parametrize(
    ("route_map", "problem"),
    [
        ([{"stepSlug": "classify", "queueName": QUEUES[0]}], "entry 1 is missing"),
        (
            [
                {"stepSlug": "classify", "queueName": QUEUES[0]},
                {"stepSlug": "deliverSlack", "queueName": QUEUES[1]},
                {"stepSlug": "deliverSlack", "queueName": QUEUES[1]},
            ],
            "entry 2 is extra",
        ),
        (
            [
                {"stepSlug": "deliverSlack", "queueName": QUEUES[1]},
                {"stepSlug": "classify", "queueName": QUEUES[0]},
            ],
            "entry 0: expected",
        ),
        (
            [
                {"stepSlug": "classify", "queueName": "somewhere_else"},
                {"stepSlug": "deliverSlack", "queueName": QUEUES[1]},
            ],
            "entry 0: expected",
        ),
        (
            [
                {"stepSlug": "classify", "queueName": QUEUES[0], "extra": 1},
                {"stepSlug": "deliverSlack", "queueName": QUEUES[1]},
            ],
            "entry 0: expected",
        ),
    ],
    ids=["missing", "extra-duplicate", "reordered", "mismatched", "unknown-key"],
)
def test_a_route_map_that_is_not_exactly_the_derived_one_is_rejected(
    engine: Engine, route_map: list[dict[str, Any]], problem: str
) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
        engine.compile("threads", STEPS, route_map=route_map)
    assert "does not match the routes the engine derives" in str(raised.value.diag.message_primary)
    assert problem in str(raised.value.diag.message_detail)
    assert engine.value("select count(*) from pgflow.flows") == 0
    assert queues(engine) == []


def test_step_mode_needs_the_route_map(engine: Engine) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"route map .* is missing"):
        engine.compile("threads", STEPS, route_map=None)


def test_a_mode_difference_is_a_routing_mismatch_in_production(engine: Engine) -> None:
    engine.compile("threads", STEPS, mode="flow")
    run_id = engine.start("threads")
    result = engine.compile("threads", STEPS, mode="step")
    assert (result["status"], result["mismatchKind"]) == ("mismatch", "routing")
    assert result["differences"] == [
        'Queue mode of flow "threads" differs: expected "step", persisted "flow"',
        'Route of step "classify" of flow "threads" differs: expected queue "threads__classify",'
        ' persisted "threads"',
        'Route of step "deliverSlack" of flow "threads" differs: expected queue'
        ' "threads__deliverslack", persisted "threads"',
    ]
    assert queues(engine) == ["threads"]
    assert engine.run(run_id)["status"] == "started"


def test_persisted_routes_are_compared_even_when_shape_and_mode_match(engine: Engine) -> None:
    engine.compile("threads", STEPS)
    # A manual edit (or a resolver change) moved one route: startup must notice.
    engine.conn.execute(
        "update pgflow.steps set queue_name = 'threads__elsewhere' where step_slug = 'classify'"
    )
    result = engine.compile("threads", STEPS)
    assert (result["status"], result["mismatchKind"]) == ("mismatch", "routing")
    assert result["differences"] == [
        'Route of step "classify" of flow "threads" differs: expected queue "threads__classify",'
        ' persisted "threads__elsewhere"'
    ]


def test_a_shape_difference_is_a_shape_mismatch(engine: Engine) -> None:
    engine.compile("threads", STEPS)
    result = engine.compile("threads", [{"slug": "classify"}, {"slug": "notify"}])
    assert (result["status"], result["mismatchKind"]) == ("mismatch", "shape")
    assert engine.value("select count(*) from pgflow.steps where step_slug = 'notify'") == 0


def test_local_recompilation_switches_modes_and_drops_only_the_old_queues(engine: Engine) -> None:
    engine.compile("threads", STEPS, mode="flow")
    engine.compile("other", [{"slug": "a"}], mode="flow")
    engine.start("threads")
    local(engine)
    result = engine.compile("threads", STEPS, mode="step")
    assert (result["status"], result["mismatchKind"]) == ("recompiled", "routing")
    assert queues(engine) == ["other", *QUEUES]
    assert engine.value("select count(*) from pgflow.runs") == 0
    assert engine.value("select queue_mode from pgflow.flows where flow_slug = 'threads'") == "step"


def test_a_failing_local_recompilation_keeps_the_old_definition_queues_and_runs(
    engine: Engine,
) -> None:
    engine.compile("threads", STEPS, mode="flow")
    run_id = engine.start("threads", {"x": 1})
    engine.conn.execute("select pgmq.create('threads__deliverslack')")  # someone else's queue
    local(engine)
    with pytest.raises(psycopg.errors.DuplicateObject, match="a queue of that name already exists"):
        engine.compile("threads", STEPS, mode="step")
    assert engine.value("select queue_mode from pgflow.flows") == "flow"
    assert engine.run(run_id)["status"] == "started"
    assert len(engine.queued_messages("threads")) == 1
    assert queues(engine) == ["threads", "threads__deliverslack"]


def test_a_missing_definition_never_adopts_an_existing_queue(engine: Engine) -> None:
    engine.conn.execute("select pgmq.create('threads__classify')")
    with pytest.raises(psycopg.errors.DuplicateObject) as raised:
        engine.compile("threads", STEPS)
    assert "no pgflow definition owns" in str(raised.value.diag.message_detail)
    assert engine.value("select count(*) from pgflow.flows") == 0
    assert queues(engine) == ["threads__classify"]


def test_a_queue_name_another_flow_references_is_rejected(engine: Engine) -> None:
    # Valid slugs cannot derive each other's names; a route written by hand can still clash.
    engine.call("create_flow", "other")
    engine.conn.execute(
        "insert into pgflow.steps (flow_slug, step_slug, step_index, queue_name)"
        " values ('other', 'a', 0, 'threads__classify')"
    )
    with pytest.raises(psycopg.errors.DuplicateObject, match='flow "other" already uses it'):
        engine.compile("threads", STEPS)
    assert engine.value("select count(*) from pgflow.flows") == 1


def test_an_ambiguous_listed_spelling_is_rejected(engine: Engine) -> None:
    engine.compile("threads", STEPS)
    engine.conn.execute(
        "update pgmq.meta set queue_name = 'Threads__classify'"
        " where queue_name = 'threads__classify'"
    )
    local(engine)
    with pytest.raises(psycopg.errors.DuplicateObject, match="is ambiguous"):
        engine.compile("threads", [{"slug": "classify"}])
    assert engine.value("select count(*) from pgflow.steps") == 2


def test_a_failing_queue_creation_leaves_no_definition_or_queue(engine: Engine) -> None:
    engine.conn.execute(
        """create or replace function pgmq.validate_queue_name(queue_name text) returns void
        language plpgsql as $$ begin
          if queue_name = 'threads__deliverslack' then raise exception 'refused'; end if;
        end $$"""
    )
    with pytest.raises(psycopg.errors.RaiseException, match="refused"):
        engine.compile("threads", STEPS)
    assert engine.value("select count(*) from pgflow.flows") == 0
    assert queues(engine) == []


def test_a_case_variant_of_an_existing_flow_is_rejected(engine: Engine) -> None:
    engine.compile("threads", STEPS)
    with pytest.raises(psycopg.errors.UniqueViolation, match="differs only in case"):
        engine.compile("Threads", STEPS)


def test_create_flow_refuses_an_existing_step_queued_flow(engine: Engine) -> None:
    engine.compile("threads", STEPS)
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="uses per-step queues"):
        engine.call("create_flow", "threads")


def test_add_step_refuses_a_step_queued_flow(engine: Engine) -> None:
    engine.compile("threads", STEPS)
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="uses per-step queues"):
        engine.call("add_step", "threads", "extra")
    assert engine.value("select count(*) from pgflow.steps") == 2


def test_repeated_definition_calls_never_reset_a_persisted_route(engine: Engine) -> None:
    engine.compile("threads", STEPS)
    for function, args in (("create_flow", ["threads"]), ("add_step", ["threads", "classify"])):
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
            engine.call(function, *args)
    assert engine.compile("threads", STEPS)["status"] == "verified"
    routes = engine.all("select queue_name from pgflow.steps order by step_index")
    assert [r["queue_name"] for r in routes] == QUEUES


def test_concurrent_compilation_by_several_step_workers_converges(
    engine: Engine, db_url: str
) -> None:
    shape = {"steps": [shape_step(**s) for s in STEPS]}
    route_map = [
        {"stepSlug": s["slug"], "queueName": q} for s, q in zip(STEPS, QUEUES, strict=True)
    ]
    barrier = threading.Barrier(6)
    statuses: list[Any] = []

    def worker() -> None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            barrier.wait()
            try:
                row = conn.execute(
                    "select pgflow.ensure_flow_compiled('threads', %s, 'step', %s)",
                    (Jsonb(shape), Jsonb(route_map)),
                ).fetchone()
                statuses.append(row[0]["status"] if row else None)
            except psycopg.Error as exc:  # collected and asserted below
                statuses.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(map(str, statuses)) == ["compiled"] + ["verified"] * 5
    assert queues(engine) == QUEUES
    assert engine.value("select count(*) from pgflow.steps") == 2

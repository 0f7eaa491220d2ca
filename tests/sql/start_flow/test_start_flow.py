from __future__ import annotations

import uuid

import psycopg
import pytest

from tests.engine import Engine

CHAIN = ({"slug": "first"}, {"slug": "second", "deps_slugs": ["first"]})


def test_creates_a_started_run_counting_every_step(engine: Engine) -> None:
    engine.flow("chain", *CHAIN)
    run = engine.run(engine.start("chain", {"x": 1}))
    assert (run["status"], run["remaining_steps"], run["input"]) == ("started", 2, {"x": 1})


def test_starts_root_steps_and_leaves_dependents_created(engine: Engine) -> None:
    engine.flow("chain", *CHAIN)
    run_id = engine.start("chain")
    assert engine.state(run_id, "first")["status"] == "started"
    second = engine.state(run_id, "second")
    assert (second["status"], second["remaining_deps"]) == ("created", 1)


def test_sends_one_message_carrying_only_the_task_key(engine: Engine) -> None:
    engine.flow("chain", *CHAIN)
    run_id = engine.start("chain", {"secret": "s3cr3t"})
    [message] = engine.queued_messages("chain")
    assert message["message"] == {
        "flow_slug": "chain",
        "run_id": str(run_id),
        "step_slug": "first",
        "task_index": 0,
    }
    task = engine.task(run_id, "first")
    assert (task["message_id"], task["queue_name"], task["status"]) == (
        message["msg_id"],
        "chain",
        "queued",
    )


def test_uses_the_given_run_id(engine: Engine) -> None:
    engine.flow("chain", *CHAIN)
    run_id = uuid.uuid4()
    rows = engine.call("start_flow", "chain", {"a": 1}, run_id=run_id)
    assert rows[0]["run_id"] == run_id


def test_starts_all_independent_root_steps_at_once(engine: Engine) -> None:
    engine.flow("fan", {"slug": "a"}, {"slug": "b"}, {"slug": "c"})
    run_id = engine.start("fan")
    assert {engine.state(run_id, s)["status"] for s in "abc"} == {"started"}
    assert len(engine.queued_messages("fan")) == 3


def test_rejects_an_unknown_flow(engine: Engine) -> None:
    with pytest.raises(psycopg.errors.NoDataFound, match='Flow "nope" does not exist'):
        engine.start("nope")


def test_rejects_sql_null_input_and_writes_nothing(engine: Engine) -> None:
    engine.flow("chain", *CHAIN)
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="must not be SQL NULL"):
        engine.call("start_flow", "chain", None)
    assert engine.value("select count(*) from pgflow.runs") == 0


def test_accepts_json_null_as_input(engine: Engine) -> None:
    engine.flow("chain", *CHAIN)
    run_id = engine.start("chain", None)
    assert engine.run(run_id)["status"] == "started"


def test_completes_a_flow_without_steps_at_once(engine: Engine) -> None:
    engine.flow("empty")
    run = engine.run(engine.start("empty"))
    assert (run["status"], run["output"]) == ("completed", None)


def test_start_delay_hides_the_first_message(engine: Engine) -> None:
    engine.flow("delayed", {"slug": "later", "start_delay": 120})
    engine.start("delayed")
    assert (
        engine.value(
            "select count(*) from pgmq.q_delayed where vt > now() + interval '110 seconds'"
        )
        == 1
    )
    assert engine.poll("delayed") == []

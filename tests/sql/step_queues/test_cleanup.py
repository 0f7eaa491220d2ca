"""Deletion and pruning by queue mode: a step-queued flow owns exactly its step queues, never an
unrelated queue that happens to be called lower(flow_slug)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.engine import Engine

STEPS: list[dict[str, Any]] = [{"slug": "classify"}, {"slug": "deliverSlack", "deps": ["classify"]}]


def queues(engine: Engine) -> list[str]:
    return [r["queue_name"] for r in engine.all("select queue_name from pgmq.meta order by 1")]


def test_deleting_a_step_flow_drops_its_step_queues_only(engine: Engine) -> None:
    engine.conn.execute("select pgmq.create('threads')")  # unrelated, same name as the slug
    engine.conn.execute("select pgmq.send('threads', '{\"keep\": true}'::jsonb)")
    engine.compile("threads", STEPS)
    engine.start("threads")
    engine.call("delete_flow_and_data", "threads")
    assert queues(engine) == ["threads"]
    assert len(engine.queued_messages("threads")) == 1
    assert engine.value("select count(*) from pgflow.flows") == 0


def test_deletion_drops_a_queue_under_the_spelling_pgmq_lists(engine: Engine) -> None:
    engine.compile("threads", STEPS)
    engine.conn.execute(
        "update pgmq.meta set queue_name = 'Threads__classify'"
        " where queue_name = 'threads__classify'"
    )
    engine.call("delete_flow_and_data", "threads")
    assert queues(engine) == []
    assert engine.value("select to_regclass('pgmq.q_threads__classify')") is None


def test_deletion_refuses_two_spellings_of_one_queue_and_deletes_nothing(engine: Engine) -> None:
    engine.compile("threads", STEPS)
    engine.start("threads")
    engine.conn.execute("select pgmq.create('THREADS__classify')")  # same tables, second name
    with pytest.raises(psycopg.errors.DuplicateObject, match="is ambiguous"):
        engine.call("delete_flow_and_data", "threads")
    assert engine.value("select count(*) from pgflow.runs") == 1
    assert len(engine.queued_messages("threads__classify")) == 1


def test_pruning_a_step_flow_uses_its_step_queues_and_not_the_default_name(
    engine: Engine,
) -> None:
    engine.conn.execute("select pgmq.create('threads')")
    engine.compile("threads", STEPS)
    for queue in ("threads", "threads__classify"):
        engine.conn.execute(
            f"insert into pgmq.a_{queue} (msg_id, vt, message, archived_at)"
            " values (1, now(), '{}', now() - interval '30 days')"
        )
    result = engine.value("select pgflow.prune_data_older_than(interval '7 days')")
    assert result["archived_messages"] == 1
    assert engine.value("select count(*) from pgmq.a_threads__classify") == 0
    assert engine.value("select count(*) from pgmq.a_threads") == 1


def test_pruning_skips_a_route_whose_queue_was_dropped_by_hand(engine: Engine) -> None:
    engine.compile("threads", STEPS)
    engine.conn.execute("select pgmq.drop_queue('threads__classify')")
    result = engine.value("select pgflow.prune_data_older_than(interval '7 days')")
    assert result["archived_messages"] == 0

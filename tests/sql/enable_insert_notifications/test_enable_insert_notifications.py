"""enable_insert_notifications: a queue's inserts wake its listeners with one notification per
statement, on the channel PGMQ's trigger uses, in place of PGMQ's per-row trigger (which it
drops, keeping the throttle row earlier workers look for); no insert goes unheard."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.engine import Engine

CHANNEL = "pgmq.q_fan.INSERT"


def triggers(engine: Engine, table: str) -> list[str]:
    rows = engine.all(
        "select tgname from pg_trigger where tgrelid = %s::regclass and not tgisinternal"
        " order by tgname",
        f"pgmq.{table}",
    )
    return [row["tgname"] for row in rows]


def heard(listener: psycopg.Connection[Any]) -> list[str | None]:
    """The notifications committed so far (a short timeout: they arrive with the commit)."""
    return [n.payload for n in listener.notifies(timeout=0.5)]


@pytest.fixture
def fan(engine: Engine) -> Engine:
    engine.flow(
        "fan", {"slug": "items"}, {"slug": "each", "deps_slugs": ["items"], "step_type": "map"}
    )
    return engine


def test_a_fan_out_of_many_messages_is_one_notification(fan: Engine, db_url: str) -> None:
    assert fan.value("select pgflow.enable_insert_notifications('fan')") is True
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute(f'listen "{CHANNEL}"')
        fan.start("fan")
        assert heard(listener) == [""]  # the first step's message
        [items] = fan.poll("fan")
        fan.complete(items, list(range(500)))  # one statement inserts 500 messages
        assert heard(listener) == [""]
        assert len(fan.poll("fan", qty=1000)) == 500


def test_every_inserting_transaction_is_heard(fan: Engine, db_url: str) -> None:
    fan.value("select pgflow.enable_insert_notifications('fan')")
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute(f'listen "{CHANNEL}"')
        for _ in range(3):
            fan.conn.execute("select pgmq.send('fan', %s)", (Jsonb({"raw": True}),))
        fan.conn.execute("select pgmq.send_batch('fan', array[%s, %s]::jsonb[])",
                         (Jsonb({"a": 1}), Jsonb({"b": 2})))  # fmt: skip
        assert len(heard(listener)) == 4


def test_it_replaces_pgmqs_per_row_trigger_and_keeps_its_throttle_row(fan: Engine) -> None:
    fan.value("select pgmq.enable_notify_insert('fan', 0)")
    assert triggers(fan, "q_fan") == ["trigger_notify_queue_insert_listeners"]

    assert fan.value("select pgflow.enable_insert_notifications('fan')") is True

    assert triggers(fan, "q_fan") == ["pgflow_notify_insert"]
    # A worker of an earlier release finds the row and adds no per-row trigger again.
    assert (
        fan.value("select count(*) from pgmq.notify_insert_throttle where queue_name = 'fan'") == 1
    )
    assert fan.value("select pgflow.enable_insert_notifications('fan')") is False  # idempotent
    assert triggers(fan, "q_fan") == ["pgflow_notify_insert"]


def test_an_unknown_queue_is_refused(engine: Engine) -> None:
    with pytest.raises(psycopg.errors.UndefinedTable, match='Queue "nowhere" does not exist'):
        engine.value("select pgflow.enable_insert_notifications('nowhere')")

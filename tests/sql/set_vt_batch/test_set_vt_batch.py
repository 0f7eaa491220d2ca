from __future__ import annotations

import psycopg
import pytest

from tests.engine import Engine


def test_sets_each_message_its_own_visibility(engine: Engine) -> None:
    engine.flow("vt", {"slug": "a"}, {"slug": "b"})
    engine.start("vt")
    ids = [m["msg_id"] for m in engine.queued_messages("vt")]
    rows = engine.all("select * from pgflow.set_vt_batch('vt', %s, array[100, 200])", ids)
    assert sorted(r["msg_id"] for r in rows) == sorted(ids)
    offsets = engine.all("select msg_id, extract(epoch from vt - now()) as s from pgmq.q_vt")
    by_id = {r["msg_id"]: float(r["s"]) for r in offsets}
    assert 99 < by_id[ids[0]] <= 100.5
    assert 199 < by_id[ids[1]] <= 200.5


def test_ignores_unknown_ids_and_empty_lists(engine: Engine) -> None:
    engine.call("create_flow", "vt")
    assert (
        engine.all("select * from pgflow.set_vt_batch('vt', array[42]::bigint[], array[1])") == []
    )
    assert engine.all("select * from pgflow.set_vt_batch('vt', '{}', '{}')") == []


def test_rejects_arrays_of_different_lengths(engine: Engine) -> None:
    engine.call("create_flow", "vt")
    with pytest.raises(psycopg.errors.RaiseException, match="2 message ids but 1 offsets"):
        engine.all("select * from pgflow.set_vt_batch('vt', array[1, 2]::bigint[], array[1])")

"""pgflow.pgmq_table_name, the SQL owner of PGMQ's table names, agrees with its Python twin
(naming.pgmq_table), with PGMQ's own tables, and with the channel its insert notifications use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pgflow_gen import naming
from tests.engine import Engine

VECTORS = json.loads((Path(__file__).parents[2] / "vectors" / "queue_names.json").read_text())
QUEUES = sorted(
    {case["flow_slug"] for case in VECTORS["routes"]} | {"MixedCase_V2", "greetUser__0", "x"}
)


@pytest.mark.parametrize("queue", QUEUES)
@pytest.mark.parametrize("kind", ["q", "a"])
def test_matches_the_python_rule(engine: Engine, queue: str, kind: str) -> None:
    table = engine.value("select pgflow.pgmq_table_name(%s, %s)", queue, kind)
    assert table == naming.pgmq_table(queue, kind)  # type: ignore[arg-type]


def test_names_the_tables_pgmq_makes_and_the_channel_it_notifies_on(engine: Engine) -> None:
    engine.call("create_flow", "GreetUser")
    engine.call("add_step", "GreetUser", "fullName")
    queue = "greetuser"
    for kind in ("q", "a"):
        table = engine.value("select pgflow.pgmq_table_name(%s, %s)", "GreetUser", kind)
        assert engine.value("select to_regclass(%s) is not null", f"pgmq.{table}") is True
    engine.value("select pgmq.enable_notify_insert(%s, 0)", queue)
    engine.conn.execute(f'listen "{naming.pgmq_insert_channel("GreetUser")}"')
    engine.start("GreetUser")
    assert len(list(engine.conn.notifies(timeout=5, stop_after=1))) == 1

"""pgflow.default_queue_name, the SQL owner of the default-queue rule, agrees with its Python twin
and with the queue every flow-mode function uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pgflow_gen import naming
from tests.engine import Engine

VECTORS = json.loads((Path(__file__).parents[2] / "vectors" / "queue_names.json").read_text())
SLUGS = sorted({case["flow_slug"] for case in VECTORS["routes"]} | {"MixedCase_V2", "x"})


@pytest.mark.parametrize("flow_slug", SLUGS)
def test_matches_the_python_rule(engine: Engine, flow_slug: str) -> None:
    queue = engine.value("select pgflow.default_queue_name(%s)", flow_slug)
    assert queue == naming.default_queue_name(flow_slug)


def test_create_flow_and_add_step_use_it(engine: Engine) -> None:
    engine.call("create_flow", "GreetUser")
    engine.call("add_step", "GreetUser", "fullName")
    queue = engine.value("select queue_name from pgflow.steps where flow_slug = 'GreetUser'")
    assert queue == engine.value("select pgflow.default_queue_name('GreetUser')") == "greetuser"
    assert engine.value("select count(*) from pgmq.list_queues() where queue_name = %s", queue) == 1

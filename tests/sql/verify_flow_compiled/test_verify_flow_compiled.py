"""verify_flow_compiled (engine 0019): ensure_flow_compiled's checks and answers for a worker that
may not compile; it changes nothing, whatever pgflow.local says."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from tests.engine import Engine, shape_step

STEPS = [shape_step("fetch"), shape_step("store", ("fetch",))]


def verify(engine: Engine, shape: dict[str, Any], mode: str = "flow") -> dict[str, Any]:
    routes = None
    if mode == "step":
        routes = Jsonb(
            [{"stepSlug": s["slug"], "queueName": f"sync__{s['slug']}"} for s in shape["steps"]]
        )
    result: dict[str, Any] = engine.value(
        "select pgflow.verify_flow_compiled('sync', %s, %s, %s)", Jsonb(shape), mode, routes
    )
    return result


def test_a_missing_flow_is_reported_and_not_compiled(engine: Engine) -> None:
    assert verify(engine, {"steps": STEPS}) == {
        "status": "missing", "mismatchKind": None, "differences": []
    }  # fmt: skip
    assert engine.value("select count(*) from pgflow.flows") == 0


def test_a_matching_flow_is_verified_without_adopting_its_options(engine: Engine) -> None:
    engine.value("select pgflow.ensure_flow_compiled('sync', %s)", Jsonb({"steps": STEPS}))
    changed = {"steps": STEPS, "options": {"maxAttempts": 7}}
    assert verify(engine, changed)["status"] == "verified"
    assert engine.value("select opt_max_attempts from pgflow.flows") != 7


def test_a_different_flow_is_a_mismatch_even_in_a_local_database(engine: Engine) -> None:
    engine.value("select pgflow.ensure_flow_compiled('sync', %s)", Jsonb({"steps": STEPS}))
    engine.conn.execute("set pgflow.local = on")
    other = {"steps": [shape_step("fetch"), shape_step("save", ("fetch",))]}
    result = verify(engine, other)
    assert (result["status"], result["mismatchKind"]) == ("mismatch", "shape")
    assert result["differences"]
    routing = verify(engine, {"steps": STEPS}, mode="step")
    assert (routing["status"], routing["mismatchKind"]) == ("mismatch", "routing")
    assert routing["differences"][0].startswith('Queue mode of flow "sync" differs')
    assert [r["step_slug"] for r in engine.all("select step_slug from pgflow.steps")] == [
        "fetch",
        "store",
    ]

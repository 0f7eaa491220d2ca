"""The order service end to end, as it runs in production: the FastAPI app (through httpx) on a
fresh database with the engine, the flow registered by its generated migration
(`pgflow-gen db apply`, tests/conftest.py), and the flow's generated worker in a process of its
own."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from app.main import app

from pgflow_gen.testing import FlowDatabase

EXAMPLE = Path(__file__).resolve().parents[1]
DEADLINE_S = 60.0


@pytest.fixture
def shop(orders_db: FlowDatabase, monkeypatch: pytest.MonkeyPatch) -> Iterator[FlowDatabase]:
    """The example's database with the flow's worker running; the app configured for it."""
    pgflow = orders_db
    env = {**os.environ, "PGFLOW_DATABASE_URL": pgflow.url}
    worker = subprocess.Popen(
        [sys.executable, "-m", "app.pgflow.workers.order_fulfilment.worker"],
        cwd=EXAMPLE, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    monkeypatch.setenv("PGFLOW_DATABASE_URL", pgflow.url)
    try:
        with pgflow.connect() as conn:  # up once it has registered (its signals handled then)
            end = time.monotonic() + DEADLINE_S
            while not conn.execute("select 1 from pgflow.workers").fetchone():
                assert worker.poll() is None, worker.communicate()[1]
                assert time.monotonic() < end, "the worker did not start"
                time.sleep(0.05)
        yield pgflow
    finally:
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=30)
        assert worker.returncode == 0, stderr
        assert "Traceback" not in stderr


async def until(http: httpx.AsyncClient, order_id: int, **expected: Any) -> dict[str, Any]:
    """The order's status once it shows `expected`; fails after DEADLINE_S."""
    end = time.monotonic() + DEADLINE_S
    while True:
        status: dict[str, Any] = (await http.get(f"/orders/{order_id}")).json()
        if all(status.get(key) == value for key, value in expected.items()):
            return status
        assert time.monotonic() < end, f"order {order_id} is {status}, not {expected}"
        await asyncio.sleep(0.05)


def serve(scenario: Any) -> Any:
    """Run `scenario(http)` against the app, its lifespan started and stopped around it."""

    async def main() -> Any:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://shop") as http:
                return await scenario(http)

    return asyncio.run(main())


def test_an_order_waits_for_its_payment_then_ships(shop: FlowDatabase) -> None:
    async def scenario(http: httpx.AsyncClient) -> None:
        placed = await http.post("/orders", json={"customer": "Ada", "amount_cents": 4200})
        assert placed.status_code == 201, placed.text
        order_id, done_run = placed.json()["order_id"], placed.json()["run_id"]
        await until(http, order_id, status="started", waiting_for=["payment"])

        paid = {"order_id": order_id, "paid": True, "reference": "pay_42"}
        assert (await http.post("/webhooks/payment", json=paid)).status_code == 202
        done = await until(http, order_id, status="completed")
        assert done["output"] == {"ship": f"shipped order {order_id}, paid (pay_42)"}

        again = await http.post("/webhooks/payment", json=paid)  # the provider retries
        assert again.status_code == 409
        assert again.json()["detail"] == f"Run {done_run} is completed, so it takes no signal."

    serve(scenario)


def test_an_order_refused_before_its_commit_leaves_no_order_and_no_run(
    shop: FlowDatabase,
) -> None:
    async def scenario(http: httpx.AsyncClient) -> None:
        refused = await http.post("/orders", json={"customer": "Grace", "amount_cents": 200_000})
        assert refused.status_code == 402
        invalid = await http.post("/orders", json={"customer": "", "amount_cents": 5})
        assert invalid.status_code == 422
        assert (await http.get("/orders/1")).status_code == 404
        unknown = {"order_id": 1, "paid": True, "reference": "pay_1"}
        assert (await http.post("/webhooks/payment", json=unknown)).status_code == 404

    serve(scenario)
    with shop.connect() as conn:
        assert conn.execute("select count(*) from orders").fetchone() == (0,)
        assert conn.execute("select count(*) from pgflow.runs").fetchone() == (0,)
        assert conn.execute("select count(*) from pgmq.q_orderfulfilment").fetchone() == (0,)

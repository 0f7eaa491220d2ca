"""An order service on FastAPI. Placing an order inserts it and starts its flow in one
transaction, so there is never an order without its run or a run for an order that rolled back;
the payment provider's webhook sends the run its payment signal; a status endpoint reads both.

    PGFLOW_DATABASE_URL=postgresql://... uvicorn app.main:app
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from typing import Any

import psycopg_pool
from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, Field

from app.pgflow.order_fulfilment import FLOW, Input, Output, PaymentPayload
from pgflow_gen.runtime import AsyncClient, AsyncRun, SignalRefusedError

#: The application's own table (an application keeps it in its own migrations).
SCHEMA = """
create table if not exists orders (
  id bigint generated always as identity primary key,
  customer text not null,
  amount_cents int not null,
  run_id uuid,
  placed_at timestamptz not null default now()
)"""
#: What a customer's orders may add up to.
CREDIT_LIMIT_CENTS = 100_000


class NewOrder(BaseModel):
    customer: str = Field(min_length=1)
    amount_cents: int = Field(gt=0)


class PaymentEvent(BaseModel):
    order_id: int
    paid: bool
    reference: str


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncGenerator[None]:
    # One AsyncClient per process; the database URL from PGFLOW_DATABASE_URL (or DATABASE_URL).
    # The application's own pool: out of autocommit, so `pool.connection()` is one transaction,
    # committed when the block ends and rolled back when it raises.
    async with (
        AsyncClient() as client,
        psycopg_pool.AsyncConnectionPool(client.url, min_size=1, open=False) as pool,
    ):
        async with pool.connection() as conn:
            await conn.execute(SCHEMA)
        app.state.client, app.state.pool = client, pool
        yield


app = FastAPI(title="orders", lifespan=lifespan)


@app.post("/orders", status_code=201)
async def place_order(order: NewOrder, request: Request) -> dict[str, Any]:
    client: AsyncClient = request.app.state.client
    async with request.app.state.pool.connection() as conn:
        cursor = await conn.execute(
            "insert into orders (customer, amount_cents) values (%s, %s) returning id",
            (order.customer, order.amount_cents),
        )
        (order_id,) = await cursor.fetchone()
        run = await client.start_flow(
            FLOW,
            Input(order_id=order_id, customer=order.customer, amount_cents=order.amount_cents),
            connection=conn,  # in this transaction: it starts when the order is committed
        )
        await conn.execute("update orders set run_id = %s where id = %s", (run.run_id, order_id))
        # Anything that fails before the commit (this check, a crash) takes the run with it.
        cursor = await conn.execute(
            "select sum(amount_cents) from orders where customer = %s", (order.customer,)
        )
        (total,) = await cursor.fetchone()
        if total > CREDIT_LIMIT_CENTS:
            raise HTTPException(402, f"{order.customer} is over the credit limit")
    return {"order_id": order_id, "run_id": str(run.run_id)}


@app.post("/webhooks/payment", status_code=202)
async def payment_received(event: PaymentEvent, request: Request) -> dict[str, Any]:
    client: AsyncClient = request.app.state.client
    run_id = await _run_of(request, event.order_id)
    try:
        sent = await client.send_signal(
            run_id, FLOW.signals.payment, PaymentPayload(paid=event.paid, reference=event.reference)
        )
    except SignalRefusedError as exc:  # a provider sending the event again, say
        raise HTTPException(409, exc.message) from exc
    return {"order_id": event.order_id, "received_at": sent.received_at.isoformat()}


@app.get("/orders/{order_id}")
async def order_status(order_id: int, request: Request) -> dict[str, Any]:
    client: AsyncClient = request.app.state.client
    run: AsyncRun[Output] = await client.get_run(await _run_of(request, order_id))
    waiting = await run.waiting_signals()
    return {
        "order_id": order_id,
        "status": run.status,
        "waiting_for": [signal.step_slug for signal in waiting],
        "output": run.output,
    }


async def _run_of(request: Request, order_id: int) -> uuid.UUID:
    async with request.app.state.pool.connection() as conn:
        cursor = await conn.execute("select run_id from orders where id = %s", (order_id,))
        row = await cursor.fetchone()
    if row is None:
        raise HTTPException(404, f"No order {order_id}.")
    run_id: uuid.UUID = row[0]
    return run_id

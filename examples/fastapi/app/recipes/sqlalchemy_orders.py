"""Start the order's flow in a SQLAlchemy 2 session's transaction (driver psycopg 3: URLs
`postgresql+psycopg://...`): the run starts when the session commits, and a rollback takes it
with the order.

    with Session(engine) as session, session.begin():
        place_order(session, client, "Ada", 4200)
"""

from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from app.pgflow.order_fulfilment import FLOW, Input
from pgflow_gen.runtime import AsyncClient, Client

INSERT = text(
    "insert into orders (customer, amount_cents) values (:customer, :amount) returning id"
)


def place_order(session: Session, client: Client, customer: str, amount_cents: int) -> uuid.UUID:
    order_id: int = session.execute(
        INSERT, {"customer": customer, "amount": amount_cents}
    ).scalar_one()
    # The psycopg connection under the session's, in the session's transaction.
    conn = session.connection().connection.driver_connection
    run = client.start_flow(
        FLOW,
        Input(order_id=order_id, customer=customer, amount_cents=amount_cents),
        connection=conn,
    )
    return run.run_id


async def place_order_async(
    session: AsyncSession, client: AsyncClient, customer: str, amount_cents: int
) -> uuid.UUID:
    result = await session.execute(INSERT, {"customer": customer, "amount": amount_cents})
    order_id: int = result.scalar_one()
    raw = await (await session.connection()).get_raw_connection()
    run = await client.start_flow(
        FLOW,
        Input(order_id=order_id, customer=customer, amount_cents=amount_cents),
        connection=raw.driver_connection,  # the session's psycopg AsyncConnection
    )
    return run.run_id

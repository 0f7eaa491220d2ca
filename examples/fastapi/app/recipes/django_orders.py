"""Start the order's flow in a Django transaction (Django 5 on psycopg 3): the run starts when
`transaction.atomic()` commits, and a rollback takes it with the order. A model's
`Order.objects.create(...)` in the block works the same as the SQL here."""

from __future__ import annotations

import uuid

from django.db import connection, transaction

from app.pgflow.order_fulfilment import FLOW, Input
from pgflow_gen.runtime import Client


def place_order(client: Client, customer: str, amount_cents: int) -> uuid.UUID:
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                "insert into orders (customer, amount_cents) values (%s, %s) returning id",
                [customer, amount_cents],
            )
            (order_id,) = cursor.fetchone()
        run = client.start_flow(
            FLOW,
            Input(order_id=order_id, customer=customer, amount_cents=amount_cents),
            connection=connection.connection,  # Django's psycopg connection, in the atomic block
        )
    return run.run_id

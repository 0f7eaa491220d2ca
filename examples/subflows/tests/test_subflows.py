"""Tests of the subflow examples with the testing kit: each run's whole tree (the parent and its
shippingV1 runs) runs in process."""

from __future__ import annotations

import pytest
from app import orders, shipping
from app.pgflow import bulk_ship_v1, orders_v1, shipping_v1
from app.pgflow.bulk_ship_v1 import InputItem

from pgflow_gen.runtime.errors import ConfigError
from pgflow_gen.testing import FlowDatabase

SHIPPING: shipping_v1.Handlers = {"pack": shipping.pack, "label": shipping.label}
ORDERS: orders_v1.Handlers = {"check": orders.check, "tell": orders.tell}
BULK: bulk_ship_v1.Handlers = {"report": orders.report}
SUBFLOWS = [(shipping_v1.FLOW, SHIPPING)]


def test_an_order_ships_through_the_shipping_flow(pgflow: FlowDatabase) -> None:
    run = pgflow.run_flow(
        orders_v1.STEP_QUEUED_FLOW,
        handlers=ORDERS,
        input=orders_v1.Input(order_id=8),
        subflows=SUBFLOWS,
    )
    assert run.status == "completed"
    assert run.output == {"tell": "order 8 is on its way: T-2HS-LARGE"}


def test_each_parcel_of_a_list_runs_its_own_shipping_run(pgflow: FlowDatabase) -> None:
    parcels = [
        InputItem(address="1 Main Street", weight_grams=800),
        InputItem(address="2 High Street", weight_grams=2_500),
    ]
    run = pgflow.run_flow(bulk_ship_v1.FLOW, handlers=BULK, input=parcels, subflows=SUBFLOWS)
    assert run.status == "completed"
    assert run.output == {"report": "T-1MS-SMALL, T-2HS-LARGE"}


def test_a_parcel_the_child_cannot_pack_fails_the_order_after_its_retries(
    pgflow: FlowDatabase,
) -> None:
    run = pgflow.run_flow(
        orders_v1.FLOW, handlers=ORDERS, input=orders_v1.Input(order_id=9), subflows=SUBFLOWS
    )
    assert run.status == "failed"
    assert run.failure is not None
    assert run.failure.step_slug == "ship"
    assert run.failure.attempts == 2  # ship's max_attempts: the child was retried once, in place
    assert run.failure.summary is not None
    assert 'of flow "shippingV1" failed: step "pack": CannotPack: a parcel of 0 g' in (
        run.failure.summary
    )


def test_run_flow_needs_the_handlers_of_every_subflow(pgflow: FlowDatabase) -> None:
    with pytest.raises(ConfigError, match='runs flow "shippingV1", which run_flow was not given'):
        pgflow.run_flow(orders_v1.FLOW, handlers=ORDERS, input=orders_v1.Input(order_id=7))

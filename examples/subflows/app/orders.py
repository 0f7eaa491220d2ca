"""Handlers of flows ordersV1 and bulkShipV1. Their subflow steps have none: each runs
shippingV1, and the steps after them read its output, typed as shippingV1's `Output`."""

from __future__ import annotations

from app.pgflow.bulk_ship_v1 import Input as BulkInput
from app.pgflow.bulk_ship_v1 import ReportDeps
from app.pgflow.bulk_ship_v1 import Steps as BulkSteps
from app.pgflow.orders_v1 import CheckOutput, Input, Steps, TellDeps
from pgflow_gen.runtime import Context, PermanentError

#: The shop's orders: id -> (address, weight in grams).
ORDERS = {7: ("1 Main Street", 800), 8: ("2 High Street", 2_500), 9: ("3 Low Road", 0)}


class UnknownOrder(PermanentError):
    """An order the shop does not have: no retry finds it."""


@Steps.check
def check(flow_input: Input, ctx: Context[Input], /) -> CheckOutput:
    order_id = flow_input["order_id"]
    if order_id not in ORDERS:
        raise UnknownOrder(f"there is no order {order_id}")
    address, weight = ORDERS[order_id]
    return {"address": address, "weight_grams": weight}


@Steps.tell
def tell(deps: TellDeps, ctx: Context[Input], /) -> str:
    tracking = deps["ship"]["label"]["tracking"]
    return f"order {ctx.flow_input()['order_id']} is on its way: {tracking}"


@BulkSteps.report
def report(deps: ReportDeps, ctx: Context[BulkInput], /) -> str:
    return ", ".join(parcel["label"]["tracking"] for parcel in deps["each"])

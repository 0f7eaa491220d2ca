"""Handlers of e2eOrders and of its subflow e2eShipping."""

from __future__ import annotations

from app.pgflow.e2e_orders import CheckOutput, TellDeps
from app.pgflow.e2e_orders import Input as OrdersInput
from app.pgflow.e2e_shipping import Input as ShippingInput
from app.pgflow.e2e_shipping import LabelDeps, LabelOutput, PackOutput
from pgflow_gen.runtime import Context


def check(flow_input: OrdersInput, ctx: Context[OrdersInput], /) -> CheckOutput:
    return {"address": flow_input["address"].strip(), "order_id": flow_input["order_id"]}


def pack(flow_input: ShippingInput, ctx: Context[ShippingInput], /) -> PackOutput:
    return {"box": f"box for {flow_input['address']}"}


def label(deps: LabelDeps, ctx: Context[ShippingInput], /) -> LabelOutput:
    return {"tracking": f"T-{ctx.flow_input()['order_id']}"}


def tell(deps: TellDeps, ctx: Context[OrdersInput], /) -> str:
    return f"order {ctx.flow_input()['order_id']} shipped: {deps['ship']['label']['tracking']}"

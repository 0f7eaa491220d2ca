"""Handlers of e2eOrders and of its subflow e2eShipping. A worker started with
E2E_SHIPPING_BUG set fails `label` while the file it names exists (a bug, fixed by removing
it)."""

from __future__ import annotations

import os
from pathlib import Path

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
    bug = os.environ.get("E2E_SHIPPING_BUG")
    if bug and Path(bug).exists():
        raise RuntimeError(f"a bug in label ({bug})")
    return {"tracking": f"T-{ctx.flow_input()['order_id']}"}


def tell(deps: TellDeps, ctx: Context[OrdersInput], /) -> str:
    return f"order {ctx.flow_input()['order_id']} shipped: {deps['ship']['label']['tracking']}"

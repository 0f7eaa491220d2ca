"""Handlers of flow orderFulfilment (queue mode flow: one worker runs both). The payment step
has none: the payment provider's webhook sends its signal (app/main.py)."""

from __future__ import annotations

from app.pgflow.order_fulfilment import Input, ShipDeps, Steps
from pgflow_gen.runtime import Context


@Steps.reserve_stock
def reserve_stock(flow_input: Input, ctx: Context[Input], /) -> str:
    return f"reserved order {flow_input['order_id']} for {flow_input['customer']}"


@Steps.ship
async def ship(deps: ShipDeps, ctx: Context[Input], /) -> str:
    order = await ctx.flow_input_async()
    return f"shipped order {order['order_id']}, paid ({deps['payment']['reference']})"

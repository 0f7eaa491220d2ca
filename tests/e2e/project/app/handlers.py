"""Handlers of the end-to-end test flows. Tests steer them through the run input: `gate` names a
file the `first` handler waits for (so a test can hold a task in flight), `fail_first` makes it
fail that many attempts before succeeding; the name "a number, please" makes `shout` return an
output of the wrong type."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import cast

from app.pgflow.e2e_approvals import FinishDeps
from app.pgflow.e2e_approvals import Input as ApprovalsInput
from app.pgflow.e2e_capped import Input as CappedInput
from app.pgflow.e2e_fair import Input as FairInput
from app.pgflow.e2e_fanout import Input as FanoutInput
from app.pgflow.e2e_fanout import NumbersDeps, PickOutput
from app.pgflow.e2e_metered import Input as MeteredInput
from app.pgflow.e2e_ordered import Input as OrderedInput
from app.pgflow.e2e_plain import Input as PlainInput
from app.pgflow.e2e_plain import WrapUpDeps
from app.pgflow.e2e_scheduled import Input as ScheduledInput
from app.pgflow.e2e_steps import FirstOutput, Input, SecondDeps
from app.pgflow.e2e_timeouts import Input as TimeoutsInput
from pgflow_gen.runtime import Context, PermanentError

GATE_DEADLINE = 60.0


def first(flow_input: Input, ctx: Context[Input], /) -> FirstOutput:
    gate = flow_input.get("gate")
    if gate:
        ctx.logger.info("waiting for gate %s", gate)
        deadline = time.monotonic() + GATE_DEADLINE
        while not Path(gate).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"gate {gate} never opened")
            time.sleep(0.02)
    fail_first = flow_input.get("fail_first", 0)
    if fail_first and ctx.attempt <= fail_first:
        raise RuntimeError(f"planned failure on attempt {ctx.attempt}")
    return {"n": flow_input["n"] + 1}


async def second(deps: SecondDeps, ctx: Context[Input], /) -> int:
    await asyncio.sleep(0)
    return deps["first"]["n"] * 2


def side(flow_input: Input, ctx: Context[Input], /) -> str:
    return f"side {flow_input['n']}"


def shout(flow_input: PlainInput, ctx: Context[PlainInput], /) -> str:
    if flow_input["name"] == "a number, please":  # an output its type refuses, on purpose
        return cast(str, len(flow_input["name"]))
    return flow_input["name"].upper()


def wrap_up(deps: WrapUpDeps, ctx: Context[PlainInput], /) -> str:
    return f"{deps['shout']}!"


def pick(flow_input: FanoutInput, ctx: Context[FanoutInput], /) -> PickOutput:
    numbers = flow_input["numbers"]
    return {"numbers": numbers, "big": sum(numbers) > 10}


def numbers(deps: NumbersDeps, ctx: Context[FanoutInput], /) -> list[int]:
    return deps["pick"]["numbers"]


def double(item: int, ctx: Context[FanoutInput], /) -> int:
    return item * 2


def celebrate(deps: NumbersDeps, ctx: Context[FanoutInput], /) -> str:
    return "big!"


def slow_sync(flow_input: TimeoutsInput, ctx: Context[TimeoutsInput], /) -> str:
    """Works for `seconds`, unless the step's timeout or a cancellation of its run stops it
    first: then it notes the attempt in `marks` and returns anyway (the worker discards that
    late result)."""
    marks = Path(flow_input["marks"])
    if ctx.cancelled.wait(timeout=flow_input["seconds"]):
        (marks / f"sync-cancelled-{ctx.attempt}").touch()
        return "late"
    return "done"


async def slow_async(flow_input: TimeoutsInput, ctx: Context[TimeoutsInput], /) -> str:
    try:
        await asyncio.sleep(flow_input["seconds"])
    except asyncio.CancelledError:
        (Path(flow_input["marks"]) / f"async-cancelled-{ctx.attempt}").touch()
        raise
    return "done"


def prepare(flow_input: ApprovalsInput, ctx: Context[ApprovalsInput], /) -> str:
    if flow_input.get("decline"):
        raise PermanentError("declined: no attempt can change that")
    if not Path(flow_input["gate"]).exists():
        raise RuntimeError(f"the gate is closed (attempt {ctx.attempt})")
    return "prepared"


def finish(deps: FinishDeps, ctx: Context[ApprovalsInput], /) -> str:
    return f"{deps['prepare']} and {'approved' if deps['approval']['ok'] else 'declined'}"


def hold_for(flow_input: CappedInput, ctx: Context[CappedInput], /) -> float:
    """Works for `seconds` (a task in flight that long)."""
    time.sleep(flow_input["seconds"])
    return flow_input["seconds"]


def metered(flow_input: MeteredInput, ctx: Context[MeteredInput], /) -> int:
    return flow_input["n"]


def tick(flow_input: ScheduledInput, ctx: Context[ScheduledInput], /) -> int:
    return flow_input["n"]


async def tenant_work(flow_input: FairInput, ctx: Context[FairInput], /) -> str:
    await asyncio.sleep(flow_input["seconds"])
    return flow_input["tenant"]


def confirm(flow_input: OrderedInput, ctx: Context[OrderedInput], /) -> str:
    """e2eOrdered's step: its run was started by the order's insert (a table trigger)."""
    return f"order {flow_input['order_id']} for {flow_input['customer']} confirmed"

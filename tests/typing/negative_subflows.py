"""Subflow mistakes the generated types must catch. Each marked line MUST be an error for mypy
(the ignore's code; the run uses --warn-unused-ignores) and for pyright (tests/golden/
test_pyright.py runs it with ignore comments off and expects exactly the marked lines).
Checked against examples/subflows; never executed."""

from __future__ import annotations

from app.pgflow.bulk_ship_v1 import EachOutput, ReportDeps
from app.pgflow.orders_v1 import Handlers, Input, ShipOutput, Steps, TellDeps
from app.pgflow.shipping_v1 import LabelOutput, Output

from pgflow_gen.runtime import Context


def reads_the_childs_output(deps: TellDeps, each: ReportDeps) -> None:
    fine: Output = deps["ship"]  # a subflow step's output is its child flow's Output
    tracking: str = deps["ship"]["label"]["tracking"]
    also: EachOutput = each["each"]  # a subflow map's: the list of them
    deps["ship"]["label"]["trackng"]  # type: ignore[typeddict-item]
    deps["ship"]["pack"]  # type: ignore[typeddict-item]
    count: int = deps["ship"]["label"]["tracking"]  # type: ignore[assignment]
    one: Output = each["each"]  # type: ignore[assignment]
    print(fine, tracking, also, count, one)


def not_the_childs_output(label: LabelOutput) -> ShipOutput:
    return {"tracking": "T-1"}  # type: ignore[typeddict-item]


@Steps.tell  # type: ignore[type-var]
def tell_with_a_number(deps: TellDeps, ctx: Context[Input], /) -> int:
    return 1


def no_handler_for_a_subflow_step(handlers: Handlers) -> None:
    handlers["ship"]  # type: ignore[typeddict-item]

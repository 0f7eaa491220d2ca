"""Handlers of flow shippingV1, the child flow: it knows nothing of who runs it."""

from __future__ import annotations

from app.pgflow.shipping_v1 import Input, LabelDeps, LabelOutput, PackOutput, Steps
from pgflow_gen.runtime import Context, PermanentError

#: Parcels heavier than this go in a large box.
SMALL_BOX_GRAMS = 1_000


class CannotPack(PermanentError):
    """A parcel no retry can pack: the task fails at once."""


@Steps.pack
def pack(flow_input: Input, ctx: Context[Input], /) -> PackOutput:
    weight = flow_input["weight_grams"]
    if weight <= 0:
        raise CannotPack(f"a parcel of {weight} g cannot be packed")
    return {"box": "small" if weight <= SMALL_BOX_GRAMS else "large"}


@Steps.label
def label(deps: LabelDeps, ctx: Context[Input], /) -> LabelOutput:
    address = ctx.flow_input()["address"]
    initials = "".join(word[0] for word in address.split() if word[0].isalnum()).upper()
    return {"tracking": f"T-{initials}-{deps['pack']['box'].upper()}"}

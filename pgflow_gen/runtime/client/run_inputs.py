"""A run's input, checked before anything is written: against a generated flow's input JSON
Schema and `Input` type, or, for a flow started by its slug, against the schema it was compiled
with (`run_calls.start_flow` reads it). Problems name the JSON path of the offending value
(`runtime/inputs.py`)."""

from __future__ import annotations

import functools
import json
from typing import Any

import pydantic

from pgflow_gen import shape as shapes
from pgflow_gen.runtime import inputs
from pgflow_gen.runtime.errors import InvalidRunInputError
from pgflow_gen.runtime.flow import Flow


def validate_input(flow: Flow[Any, Any, Any], value: Any) -> None:
    """Raise InvalidRunInputError, naming the offending value's JSON path, unless `value` fits
    the flow: JSON, then its input JSON Schema (as `pgflow-gen start` checks it), then its
    `Input` type (pydantic, strict)."""
    require_json(flow.slug, value)
    if flow.input_schema is not None:
        inputs.check(flow.slug, shapes.plain(flow.input_schema), value)
    if flow.input_type is None:
        return
    try:
        _adapter(flow.input_type).validate_python(value, strict=True)
    except pydantic.ValidationError as exc:
        problems = [f"{inputs.json_path(error['loc'])}: {error['msg']}" for error in exc.errors()]
        raise InvalidRunInputError(
            f'Invalid input for flow "{flow.slug}": {problems[0]}.',
            detail="; ".join(problems),
            hint="The input must match the flow's Input type (see the generated module).",
        ) from exc


def require_json(slug: str, value: Any) -> None:
    """Raise InvalidRunInputError unless `value` is JSON (the engine checks a slug's schema)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidRunInputError(
            f'The input of flow "{slug}" is not JSON-serialisable: {exc}.'
        ) from exc


@functools.cache
def _adapter(input_type: Any) -> pydantic.TypeAdapter[Any]:
    return pydantic.TypeAdapter(input_type)

"""Checking a run input against the flow's input JSON Schema, the one its spec declares (and,
with the same messages, a handler's output against its step's output schema: `checker`).

The generated module carries the schema (`Flow.input_schema`); compiling the flow stores it in
`pgflow.flows.input_schema` (engine 0006), so `pgflow-gen start` checks an input without the
flow's Python module. Problems name the JSON path of the offending value and never quote a
value of the input itself, only its JSON type.

>>> problems({"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}},
...          {"n": "3"})
['$.n: expected integer, got string']
>>> problems({"type": "object", "required": ["n"]}, [1, 2])
['$: expected object, got array']
>>> problems({"required": ["b"], "properties": {"a": {"type": "string"}}}, {"a": 1})
['$.a: expected string, got integer', '$.b: missing (required)']
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jsonschema
from jsonschema import ValidationError

from pgflow_gen.runtime import errors


def _is_integer(checker: Any, value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# JSON Schema counts 1.0 as an integer; the typed Client (pydantic, strict) does not, and a
# generated `int` field should not receive a float: here neither does.
_Validator: Any = jsonschema.validators.extend(  # type: ignore[no-untyped-call]  # untyped in its stubs
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)

#: The most problems one error lists (the first is its message, all are in its detail).
MAX_PROBLEMS = 10
_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}


def check(flow_slug: str, schema: Mapping[str, Any], value: Any) -> None:
    """Raise InvalidRunInputError naming the first problem (all of them in its detail) unless
    `value` fits the flow's input schema."""
    found = problems(schema, value)
    if found:
        raise errors.InvalidRunInputError(
            f'Invalid input for flow "{flow_slug}": {found[0]}.',
            detail="; ".join(found),
            hint="The input must match the flow's input schema (the `input` of its spec).",
        )


def problems(schema: Mapping[str, Any], value: Any) -> list[str]:
    """What is wrong with `value` for `schema`, one line per problem, by JSON path; [] when it
    fits. The schema is JSON Schema draft 2020-12 (what flow specs use)."""
    return checker(schema)(value)


def checker(schema: Mapping[str, Any]) -> Callable[[Any], list[str]]:
    """`problems` for one schema, compiled once (a worker checks every output of a step).

    >>> checker({"type": "object", "properties": {"total": {"type": "number"}}})({"total": "9"})
    ['$.total: expected number, got string']
    """
    validator = _Validator(schema)

    def check(value: Any) -> list[str]:
        if validator.is_valid(value):
            return []  # the common case, a quarter faster than collecting no errors
        # Sorted as written, `$.path: ...`, so that a missing property sorts by its own path.
        found = (_describe(error) for error in _leaves(validator.iter_errors(value)))
        return sorted(found)[:MAX_PROBLEMS]

    return check


def _leaves(errors: Iterable[ValidationError]) -> Iterable[ValidationError]:
    """For an `anyOf` that nothing matched, the problems of its closest branch when there is one
    branch that matches the value's type, else the `anyOf` itself."""
    for error in errors:
        if error.validator == "anyOf" and error.context:
            typed = [e for e in error.context if e.validator != "type"]
            yield from (typed if typed else [error])
        else:
            yield error


def _describe(error: ValidationError) -> str:
    path = json_path(error.absolute_path)
    instance = error.instance
    if error.validator == "required":
        # jsonschema says `<repr of the name> is a required property`.
        missing = ast.literal_eval(error.message.removesuffix(" is a required property"))
        return f"{json_path([*error.absolute_path, missing])}: missing (required)"
    if error.validator == "type":
        expected = error.validator_value
        wanted = " or ".join(expected) if isinstance(expected, list) else str(expected)
        return f"{path}: expected {wanted}, got {json_type(instance)}"
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        known = error.schema.get("properties", {}) if isinstance(error.schema, Mapping) else {}
        extra = ", ".join(json.dumps(key) for key in sorted(set(instance) - set(known)))
        return f"{path}: unexpected properties {extra} (additionalProperties is false)"
    if error.validator in ("enum", "const"):
        given: Any = error.validator_value
        allowed: list[Any] = list(given) if error.validator == "enum" else [given]
        shown = ", ".join(json.dumps(v) for v in allowed[:10])
        return f"{path}: must be one of {shown}, got a different {json_type(instance)}"
    if error.validator == "anyOf":
        return f"{path}: matches none of the allowed forms (got {json_type(instance)})"
    return f"{path}: fails {error.validator}"


def json_type(value: Any) -> str:
    """The JSON type of a parsed JSON value: object, array, string, integer, number, ..."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return _JSON_TYPES.get(type(value), type(value).__name__)


def json_path(parts: Iterable[str | int]) -> str:
    """`$.address.lines[0]`: object keys after dots (quoted when not an identifier), indexes in
    brackets."""
    text = "$"
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part.isidentifier():
            text += f".{part}"
        else:
            text += f"[{json.dumps(part)}]"
    return text

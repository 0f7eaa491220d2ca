"""schema_violation checks a JSON value against the specs' JSON Schema subset in SQL (send_signal
checks payloads with it). Its verdict agrees with the `jsonschema` library on every case, and its
message names the first place that is wrong."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from psycopg.types.json import Jsonb

from tests.engine import Engine

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}},
        "home": {"$ref": "#/$defs/Place"},
        "odd key": {"const": 1},
    },
    "required": ["name"],
    "additionalProperties": False,
    "$defs": {"Place": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
}

CASES: list[tuple[Any, Any, str | None]] = [
    ({"name": "ada"}, PERSON, None),
    ({"name": "ada", "age": 36, "tags": ["a"], "home": None, "odd key": 1}, PERSON, None),
    ({"name": "ada", "age": 36.0}, PERSON, None),  # a whole number is an integer
    ({"age": 3}, PERSON, '$: "name" is required'),
    ({"name": 1}, PERSON, "$.name: expected string, got number"),
    ({"name": "ada", "age": 36.5}, PERSON, "$.age: expected integer, got a fraction"),
    ({"name": "ada", "tags": ["a", "c"]}, PERSON, '$.tags[1]: "c" is not one of ["a", "b"]'),
    ({"name": "ada", "home": 3}, PERSON, (
        "$.home: matches none of its 2 choices (the first: $.home: expected string, got number)"
    )),
    ({"name": "ada", "odd key": 2}, PERSON, '$["odd key"]: expected 1, got 2'),
    ({"name": "ada", "extra": 1}, PERSON, '$: "extra" is not a property it allows'),
    ([], PERSON, "$: expected object, got array"),
    ({"n": 1}, {"type": "object", "additionalProperties": {"type": "string"}},
     '$["n"]: expected string, got number'),
    (None, {"type": ["string", "null"]}, None),
    (True, {"type": ["string", "null"]}, "$: expected string or null, got boolean"),
    ({"anything": [1, {"x": None}]}, {}, None),
    ([1, "two"], {"type": "array", "items": {"type": "integer"}},
     "$[1]: expected integer, got string"),
]  # fmt: skip


@pytest.mark.parametrize(("value", "schema", "violation"), CASES)
def test_a_value_is_checked_as_jsonschema_checks_it(
    engine: Engine, value: Any, schema: Any, violation: str | None
) -> None:
    found = engine.value("select pgflow.schema_violation(%s, %s)", Jsonb(value), Jsonb(schema))
    assert found == violation
    assert (found is None) == jsonschema.Draft202012Validator(schema).is_valid(value)


def test_a_reference_to_a_missing_definition_is_a_violation(engine: Engine) -> None:
    found = engine.value(
        "select pgflow.schema_violation(%s, %s)", Jsonb(1), Jsonb({"$ref": "#/$defs/Gone"})
    )
    assert found == "$: the schema refers to #/$defs/Gone, which its $defs do not define"


def test_no_schema_accepts_any_value(engine: Engine) -> None:
    assert engine.value("select pgflow.schema_violation('[1]', null)") is None

"""Input problems by JSON path, without a database (the doors test uses the real engine)."""

from __future__ import annotations

import doctest

from pgflow_gen.runtime import inputs


def test_the_module_examples_hold() -> None:
    assert doctest.testmod(inputs).failed == 0


def test_problems_come_sorted_by_their_path_with_missing_properties_in_place() -> None:
    schema = {
        "type": "object",
        "required": ["a", "z"],
        "properties": {"a": {"type": "string"}, "m": {"type": "integer"}, "z": {}},
    }
    assert inputs.problems(schema, {"m": "x"}) == [
        "$.a: missing (required)",
        "$.m: expected integer, got string",
        "$.z: missing (required)",
    ]


def test_keys_that_are_not_identifiers_are_quoted_in_the_path() -> None:
    schema = {"type": "object", "properties": {"first name": {"type": "string"}}}
    assert inputs.problems(schema, {"first name": 1}) == [
        '$["first name"]: expected string, got integer'
    ]

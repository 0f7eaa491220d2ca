"""An example run input built from a flow's input schema, for the hints that show one (`start
--input`, `start --inputs`): the schema's own `examples`, `default`, `const` or first `enum`
value where it has one, else a plain value of each required property's type. An example that
does not fit the schema (a pattern, a bound the builder does not read) is not shown.

>>> example_text({"type": "object", "required": ["order_id", "total"],
...               "properties": {"order_id": {"type": "string"}, "total": {"type": "number"},
...                              "note": {"type": "string"}}})
'{"order_id": "text", "total": 1}'
>>> example_text({"type": "array", "items": {"enum": ["red", "blue"]}})
'["red"]'
>>> example_text({"type": "string", "pattern": "^[A-Z]{3}$"}) is None
True
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pgflow_gen.runtime import inputs

#: A plain value of each JSON type, and of the string formats people meet most.
_PLAIN: Mapping[str, Any] = {
    "string": "text",
    "integer": 1,
    "number": 1,
    "boolean": True,
    "null": None,
    "array": [],
    "object": {},
}
_FORMATS: Mapping[str, str] = {
    "date-time": "2026-01-31T09:00:00Z",
    "date": "2026-01-31",
    "email": "ada@example.com",
    "uuid": "00000000-0000-0000-0000-000000000000",
    "uri": "https://example.com/",
}
#: How deep nested schemas are followed; deeper ones get their type's plain value.
MAX_DEPTH = 6


def example_text(schema: Mapping[str, Any] | None) -> str | None:
    """An example input for `schema` as compact JSON, or None when there is no schema or the
    example would not fit it."""
    if schema is None:
        return None
    value = example(schema)
    if inputs.problems(schema, value):
        return None
    return json.dumps(value, separators=(", ", ": "), ensure_ascii=False)


def example(schema: Any, depth: int = 0) -> Any:
    """A value for `schema` (see the module docstring); None for what it cannot tell."""
    if not isinstance(schema, Mapping):
        return None
    for key in ("examples", "enum"):
        if isinstance(schema.get(key), list) and schema[key]:
            return schema[key][0]
    for key in ("const", "default"):
        if key in schema:
            return schema[key]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return example(schema[key][0], depth)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None and "properties" in schema:
        kind = "object"
    if depth >= MAX_DEPTH or kind not in ("object", "array", "string"):
        return _PLAIN.get(str(kind))
    if kind == "string":
        return _FORMATS.get(str(schema.get("format")), "text")
    if kind == "array":
        count = min(max(1, int(schema.get("minItems", 1))), 5)  # more: not shown (it won't fit)
        return [example(schema.get("items"), depth + 1)] * count
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return {}
    required = [name for name in schema.get("required", []) if name in properties]
    return {name: example(properties[name], depth + 1) for name in required or properties}

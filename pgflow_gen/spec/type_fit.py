"""Whether every value one spec type gives is a value another accepts, for the spec's JSON
Schema subset: what a subflow step hands its child must fit the child flow's input.

Only a certain misfit is reported: where a side says nothing (no `type`, an object without
`properties`), any value may fit, and the build lets it through (the child's input is checked
again when its run starts). Schemas are compared inlined: `inline` replaces every local `$ref`
by its `$defs` entry (validation has already refused cycles).

>>> source = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
>>> first_misfit(source, {"type": "object", "properties": {"id": {"type": "number"}}})
>>> first_misfit(source, {"type": "object", "required": ["id", "name"]})
'$.name is required, and not given'
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pgflow_gen.spec import model

Schema = Mapping[str, Any]
_KIND_OF_VALUE = {bool: "boolean", int: "integer", float: "number", str: "string"}


def inline(schema: Schema, defs: Mapping[str, Schema] | None = None) -> dict[str, Any]:
    """`schema` (as JSON) with every `$ref` replaced by its `$defs` entry, and no `$defs`."""
    defs = dict(defs or schema.get("$defs") or {})

    def walk(node: Any) -> Any:
        if isinstance(node, Mapping):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith(model.REF_PREFIX):
                return walk(defs[ref.removeprefix(model.REF_PREFIX)])
            return {k: walk(v) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    result: dict[str, Any] = walk(schema)
    return result


def first_misfit(source: Schema | None, target: Schema | None, path: str = "$") -> str | None:
    """Why some value `source` allows cannot be a value of `target` (at a JSON path), or None
    when every value fits or it cannot be told. None for a side means any JSON."""
    if not target or source is None:
        return None
    if "anyOf" in source:
        for option in source["anyOf"]:
            found = first_misfit(option, target, path)
            if found is not None:
                return found
        return None
    if "const" in source or "enum" in source:
        values = [source["const"]] if "const" in source else list(source["enum"])
        for value in values:
            if not accepts(target, value):
                return f"{path} may be given as {_shown(value)}, which is not accepted"
        return None
    if "anyOf" in target:
        misfits = [first_misfit(source, option, path) for option in target["anyOf"]]
        return None if None in misfits else next(m for m in misfits if m is not None)
    if "const" in target or "enum" in target:
        allowed = [target["const"]] if "const" in target else list(target["enum"])
        if _kinds(source) is None:
            return None
        return (
            f"{path} may be given as any {_described(_kinds(source))}; only "
            + ", ".join(_shown(v) for v in allowed)
            + " accepted"
        )
    return _kind_misfit(source, target, path)


def _kind_misfit(source: Schema, target: Schema, path: str) -> str | None:
    source_kinds, target_kinds = _kinds(source), _kinds(target)
    if source_kinds is None:
        return None
    if target_kinds is not None:
        extra = {
            kind
            for kind in source_kinds
            if kind not in target_kinds and not (kind == "integer" and "number" in target_kinds)
        }
        if extra:
            return (
                f"{path} is given as {_described(source_kinds)}, accepted as"
                f" {_described(target_kinds)}"
            )
    if "object" in source_kinds:
        found = _object_misfit(source, target, path)
        if found is not None:
            return found
    if "array" in source_kinds and isinstance(source.get("items"), Mapping):
        items = target.get("items")
        if isinstance(items, Mapping):
            return first_misfit(source["items"], items, f"{path}[]")
    return None


def _object_misfit(source: Schema, target: Schema, path: str) -> str | None:
    given = source.get("properties")
    if not isinstance(given, Mapping):
        return None  # a free-form object: it may hold anything
    given_required = set(source.get("required") or [])
    wanted = target.get("properties") or {}
    for key in target.get("required") or []:
        if key not in given:
            return f"{path}.{key} is required, and not given"
        if key not in given_required:
            return f"{path}.{key} is required, and may be missing from what is given"
    extra = target.get("additionalProperties", True)
    for key, schema in given.items():
        if key in wanted:
            found = first_misfit(schema, wanted[key], f"{path}.{key}")
        elif extra is False:
            found = f"{path}.{key} is given, and no such field is accepted"
        elif isinstance(extra, Mapping):
            found = first_misfit(schema, extra, f"{path}.{key}")
        else:
            found = None
        if found is not None:
            return found
    return None


def accepts(schema: Schema, value: Any) -> bool:
    """Whether the JSON `value` is one of `schema`'s values."""
    if "anyOf" in schema:
        return any(accepts(option, value) for option in schema["anyOf"])
    if "const" in schema:
        return bool(schema["const"] == value and type(schema["const"]) is type(value))
    if "enum" in schema:
        return any(v == value and type(v) is type(value) for v in schema["enum"])
    kinds = _kinds(schema)
    if kinds is not None and not any(_is_kind(value, kind) for kind in kinds):
        return False
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        if any(key not in value for key in schema.get("required") or []):
            return False
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in properties:
                if not accepts(properties[key], item):
                    return False
            elif extra is False or (isinstance(extra, Mapping) and not accepts(extra, item)):
                return False
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return all(accepts(schema["items"], item) for item in value)
    return True


def _is_kind(value: Any, kind: str) -> bool:
    if kind == "null":
        return value is None
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "number":
        return type(value) in (int, float)
    return _KIND_OF_VALUE.get(type(value)) == kind


def _kinds(schema: Schema) -> set[str] | None:
    kind = schema.get("type")
    if kind is None:
        return None
    return set(kind) if isinstance(kind, list) else {kind}


def _described(kinds: set[str] | None) -> str:
    return " or ".join(sorted(kinds or {"JSON"}))


def _shown(value: Any) -> str:
    return json.dumps(value)

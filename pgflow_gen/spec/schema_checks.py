"""The checks of one JSON Schema of a spec (a flow's input, a step's output, a signal's payload):
no `$defs` entry that refers back to itself, every `$ref` resolved, Literal-able enum and const
values, and every required name a property. Problems go through the caller's `problem`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pgflow_gen.errors import excerpt
from pgflow_gen.spec import model
from pgflow_gen.spec.problems import Problem


def _cycle(definitions: dict[str, model.TypeSchema], start: str) -> list[str] | None:
    """A `$ref` path from `start` back to itself through `definitions`, or None."""
    pending = [(start, [start])]
    seen: set[str] = set()
    while pending:
        key, path = pending.pop()
        for ref in sorted(definitions[key].referenced_defs()):
            if ref == start:
                return [*path, ref]
            if ref in definitions and ref not in seen:
                seen.add(ref)
                pending.append((ref, [*path, ref]))
    return None


def problems(
    schema: model.TypeSchema, keys: tuple[str | int, ...], problem: Any, step: int | None = None
) -> Iterator[Problem]:
    definitions = schema.defs or {}
    for name in definitions:
        cycle = _cycle(definitions, name)
        if cycle is not None:
            yield problem(
                "recursive_ref",
                f'"$defs" entry "{name}" refers to itself: {" -> ".join(cycle)}.',
                (*keys, "$defs", name),
                detail="Recursive types are not supported: the generated aliases and TypedDicts"
                " would refer to themselves.",
                hint="Describe the nested part without a reference back, or as JSON (no type).",
                step=step,
            )
            break

    def walk(node: model.TypeSchema, at: tuple[str | int, ...]) -> Iterator[Problem]:
        if node.ref is not None and node.ref.removeprefix("#/$defs/") not in definitions:
            yield problem(
                "unresolved_ref",
                f'"{node.ref}" names no entry of this schema\'s "$defs".',
                (*at, "$ref"),
                hint=f"Defined: {', '.join(definitions) or '(none)'}.",
                step=step,
            )
        literals = list(node.enum or []) + (
            [node.const] if "const" in node.model_fields_set else []
        )
        for value in literals:
            too_big = isinstance(value, int) and not -(2**63) <= value < 2**63
            if too_big or not (value is None or isinstance(value, bool | int | str)):
                yield problem(
                    "unsupported_literal",
                    f"{excerpt(repr(value))} cannot be a Literal value.",
                    (*at, "enum" if value in (node.enum or []) else "const"),
                    hint="enum and const values must be strings, integers (64-bit),"
                    " booleans or null.",
                    step=step,
                )
        for name in node.required or []:
            if node.properties is None or name not in node.properties:
                yield problem(
                    "required_not_a_property",
                    f'"{name}" is required but not listed in "properties".',
                    (*at, "required"),
                    step=step,
                )
        for name, child in (node.properties or {}).items():
            yield from walk(child, (*at, "properties", name))
        if node.items is not None:
            yield from walk(node.items, (*at, "items"))
        for position, child in enumerate(node.any_of or []):
            yield from walk(child, (*at, "anyOf", position))
        if isinstance(node.additional_properties, model.TypeSchema):
            yield from walk(node.additional_properties, (*at, "additionalProperties"))
        for name, child in (node.defs or {}).items():
            yield from walk(child, (*at, "$defs", name))

    yield from walk(schema, keys)

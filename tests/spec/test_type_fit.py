"""type_fit: whether every value a subflow step gives is one its child flow's input accepts,
for the spec's JSON Schema subset, reporting only a certain misfit; and the build's subflow
checks across flows, which never loop on a cycle of flows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pgflow_gen.codegen import build
from pgflow_gen.spec import type_fit
from pgflow_gen.spec.problems import SpecErrors

PROPERTIES: dict[str, Any] = {"name": {"type": "string"}, "age": {"type": "integer"}}
PERSON: dict[str, Any] = {"type": "object", "properties": PROPERTIES, "required": ["name"]}


@pytest.mark.parametrize(
    ("given", "accepted", "misfit"),
    [
        (PERSON, PERSON, None),
        ({"type": "integer"}, {"type": "number"}, None),  # an integer is a number
        ({"type": "number"}, {"type": "integer"}, "$ is given as number, accepted as integer"),
        (None, PERSON, None),  # any JSON given: it may fit, the child's check decides
        ({"type": "object"}, PERSON, None),  # a free-form object may hold anything
        (PERSON, None, None),  # the child accepts any JSON
        (
            {"type": "object", "properties": {"name": {"type": "string"}}},
            PERSON,
            "$.name is required, and may be missing from what is given",
        ),
        (
            {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]},
            PERSON,
            "$.name is required, and not given",
        ),
        (
            {**PERSON, "properties": {**PROPERTIES, "age": {"type": "string"}}},
            PERSON,
            "$.age is given as string, accepted as integer",
        ),
        (
            {**PERSON, "properties": {**PROPERTIES, "x": {"type": "string"}}},
            {**PERSON, "additionalProperties": False},
            "$.x is given, and no such field is accepted",
        ),
        ({"enum": ["a", "b"]}, {"enum": ["a", "b", "c"]}, None),
        (
            {"enum": ["a", "z"]},
            {"enum": ["a", "b"]},
            '$ may be given as "z", which is not accepted',
        ),
        (
            {"type": "string"},
            {"enum": ["a", "b"]},
            '$ may be given as any string; only "a", "b" accepted',
        ),
        ({"type": "string"}, {"anyOf": [{"type": "integer"}, {"type": "string"}]}, None),
        (
            {"anyOf": [{"type": "string"}, {"type": "null"}]},
            {"type": "string"},
            "$ is given as null, accepted as string",
        ),
        (
            {"type": "array", "items": {"type": "string"}},
            {"type": "array", "items": {"type": "integer"}},
            "$[] is given as string, accepted as integer",
        ),
        ({"const": 3}, {"type": "integer"}, None),
        ({"const": True}, {"type": "integer"}, "$ may be given as true, which is not accepted"),
    ],
)
def test_first_misfit(given: Any, accepted: Any, misfit: str | None) -> None:
    assert type_fit.first_misfit(given, accepted) == misfit


def test_inline_replaces_refs_by_their_definitions() -> None:
    schema = {
        "$defs": {"Name": {"type": "string"}},
        "type": "object",
        "properties": {"name": {"$ref": "#/$defs/Name"}},
    }
    assert type_fit.inline(schema) == {
        "type": "object",
        "properties": {"name": {"type": "string"}},
    }


def test_a_cycle_of_flows_a_step_only_reads_from_is_reported_without_looping(
    tmp_path: Path,
) -> None:
    # "top" reads the output of a subflow step running "b", and "b" and "d" run each other.
    specs = {
        "top": "steps:\n  - {slug: call, flow: b}\n"
        "  - {slug: after, depends_on: [call], flow: c}\n",
        "b": "steps:\n  - {slug: down, flow: d}\n",
        "d": "steps:\n  - {slug: up, flow: b}\n",
        "c": "input: {type: object}\nsteps:\n  - {slug: only, handler: 'app.x:only'}\n",
    }
    paths = []
    for slug, body in specs.items():
        path = tmp_path / f"{slug}.yaml"
        path.write_text(f"slug: {slug}\n{body}")
        paths.append(path)

    with pytest.raises(SpecErrors) as raised:
        build.load(paths, project=tmp_path)

    assert sorted((p.code, p.flow_slug) for p in raised.value.problems) == [
        ("subflow_cycle", "b"),
        ("subflow_cycle", "d"),
    ]

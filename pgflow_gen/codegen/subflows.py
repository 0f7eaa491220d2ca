"""Subflow steps across the flows of one build: each names a flow of the build, no flow runs
itself through a chain of subflows, and what a step hands its child fits the child's input.
`pgflow-gen validate` reports these problems too (they need every spec of the build).

A subflow step's input is what the engine hands its child run: the run input for a root step,
else the output of its one dependency (JSON null when that may be skipped), or for a map step
one element of the array it maps. Its output is the child run's output: an object with each of
the child's leaf steps' outputs."""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pgflow_gen.codegen import step_rules
from pgflow_gen.codegen.checks import LoadedSpec
from pgflow_gen.errors import excerpt
from pgflow_gen.spec import model, type_fit
from pgflow_gen.spec.problems import Problem

#: Any JSON value (a schema that says nothing).
ANY: dict[str, Any] = {}

Specs = Mapping[str, model.FlowSpec]


def problems(loaded: Sequence[LoadedSpec]) -> Iterator[Problem]:
    specs = {item.spec.slug: item.spec for item in loaded}
    for item in loaded:
        for index, step in enumerate(item.spec.steps):
            if step.flow is not None:
                yield from _step_problems(item, index, step, step.flow, specs)


def _step_problems(
    item: LoadedSpec, index: int, step: model.StepSpec, flow: str, specs: Specs
) -> Iterator[Problem]:
    def problem(code: str, message: str, *, detail: str, hint: str) -> Problem:
        return Problem(
            code, message, item.locator.at(("steps", index, "flow")), detail=detail, hint=hint,
            flow_slug=item.spec.slug, step_slug=step.slug, step_index=index,
        )  # fmt: skip

    child = specs.get(flow)
    if child is None:
        near = [s for s in specs if s.lower() == flow.lower()]
        near = near or difflib.get_close_matches(flow, list(specs), n=1)
        yield problem(
            "unknown_subflow",
            f'Step "{step.slug}" runs flow {excerpt(repr(flow))}, which is not a flow of this'
            " build.",
            detail="A subflow is typed from its spec, so it must be built with the flow that"
            " runs it.",
            hint=f'Did you mean "{near[0]}"? Slugs are exact.'
            if near
            else "Add the flow's spec to the build, or name a flow that is in it.",
        )
        return
    cycle = _cycle(specs, item.spec.slug, flow)
    if cycle is not None:
        yield problem(
            "subflow_cycle",
            f'Flow "{item.spec.slug}" runs itself through subflows: {" -> ".join(cycle)}.',
            detail="Each run would start another run of its own flow, for ever.",
            hint="Break the cycle: a flow cannot be its own subflow, directly or not.",
        )
        return
    misfit = type_fit.first_misfit(step_input(specs, item.spec, step), flow_input(child))
    if misfit is not None:
        yield problem(
            "subflow_input_mismatch",
            f'Step "{step.slug}" cannot give flow "{child.slug}" the input it declares.',
            detail=f"{_input_origin(item.spec, step)} For the input of flow"
            f' "{child.slug}": {misfit}.',
            hint=f'Change the output that feeds "{step.slug}", or the input of flow'
            f' "{child.slug}", so that they fit.',
        )


def _cycle(specs: Specs, start: str, child: str) -> list[str] | None:
    """The chain of flows from `start` through `child` back to `start`, if there is one."""
    pending: list[list[str]] = [[start, child]]
    seen: set[str] = set()
    while pending:
        path = pending.pop()
        last = path[-1]
        if last == start:
            return path
        if last in seen or last not in specs:
            continue
        seen.add(last)
        pending += [[*path, s.flow] for s in reversed(specs[last].steps) if s.flow is not None]
    return None


def _input_origin(spec: model.FlowSpec, step: model.StepSpec) -> str:
    dependencies = step_rules.dependencies(step)
    if step.type == "map":
        source = f'"{dependencies[0]}"' if dependencies else "the run input"
        return f"A map step gives each child run one element of the array {source} gives."
    if not dependencies:
        return "A root subflow step gives its child the run input."
    dependency = next(s for s in spec.steps if s.slug == dependencies[0])
    when_skipped = " (JSON null when it is skipped)" if step_rules.skippable(dependency) else ""
    return (
        f'A subflow step gives its child the output of its dependency "{dependency.slug}"'
        f"{when_skipped}."
    )


def flow_input(spec: model.FlowSpec) -> dict[str, Any]:
    return ANY if spec.input is None else type_fit.inline(spec.input.as_json())


def flow_output(
    specs: Specs, spec: model.FlowSpec, seen: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The run output's schema: each leaf step's output, optional where the leaf may be
    skipped (as the generated `Output` types it). A flow met again on the way down (a cycle,
    reported where it closes) says nothing."""
    if spec.slug in seen:
        return ANY
    seen = seen | {spec.slug}
    index_of = {step.slug: i for i, step in enumerate(spec.steps)}
    has_dependents = {dep for step in spec.steps for dep in step_rules.dependencies(step)}
    leaves = [s for s in spec.steps if s.slug not in has_dependents]
    return {
        "type": "object",
        "properties": {leaf.slug: step_output(specs, leaf, seen) for leaf in leaves},
        "required": [
            leaf.slug
            for leaf in leaves
            if not (
                step_rules.may_vanish(leaf) or step_rules.ancestor_cascades(spec, leaf, index_of)
            )
        ],
    }


def step_output(
    specs: Specs, step: model.StepSpec, seen: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The schema of a step's whole output (a map step's: the array of its tasks' outputs)."""
    if step.signal is not None:
        one = ANY if step.signal.payload is None else type_fit.inline(step.signal.payload.as_json())
    elif step.flow is not None:
        child = specs.get(step.flow)
        one = ANY if child is None else flow_output(specs, child, seen)
    else:
        one = ANY if step.output is None else type_fit.inline(step.output.as_json())
    return {"type": "array", "items": one} if step.type == "map" else one


def step_input(specs: Specs, spec: model.FlowSpec, step: model.StepSpec) -> dict[str, Any]:
    """What a subflow step hands each child run (see the module's docstring)."""
    dependencies = step_rules.dependencies(step)
    if not dependencies:
        source = flow_input(spec)
    else:
        dependency = next(s for s in spec.steps if s.slug == dependencies[0])
        source = step_output(specs, dependency)
        if step.type != "map" and step_rules.skippable(dependency):
            source = {"anyOf": [source, {"type": "null"}]}
    if step.type == "map":
        items = source.get("items")
        return dict(items) if isinstance(items, Mapping) else ANY
    return source

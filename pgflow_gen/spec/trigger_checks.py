"""The checks of a spec's table triggers that need no database: a unique name, an input that
maps every key the flow's input requires and only keys it takes, and `changed` tests only on a
trigger on update alone. `pgflow-gen db apply` checks the rest against the database (the table,
its columns and their types; pgflow.set_flow_triggers). Problems go through the caller's
`problem`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pgflow_gen.spec import model
from pgflow_gen.spec.problems import Problem


def problems(spec: model.FlowSpec, problem: Any) -> Iterator[Problem]:
    """Each trigger's name must be unique, its input a run input of the flow's shape, and its
    `changed` tests on a trigger that fires on updates alone."""
    seen: set[str] = set()
    for index, trigger in enumerate(spec.triggers):
        at = ("triggers", index)
        name = trigger.resolved_name(index)
        if name in seen:
            yield problem(
                "duplicate_trigger_name",
                f'Two triggers of flow "{spec.slug}" are named "{name}".',
                (*at, "name"),
                hint="Give each trigger its own name.",
            )
        seen.add(name)
        yield from _input_problems(spec, trigger, name, at, problem)
        for column, tests in trigger.tests().items():
            if not tests:
                yield problem(
                    "empty_trigger_test",
                    f'Trigger "{name}" gives column {column} no test.',
                    (*at, "when", column),
                    hint="Give it a value, a list, null, or tests such as {gte: 10}.",
                )
            if "changed" in tests and set(trigger.on) != {"update"}:
                yield problem(
                    "trigger_changed_needs_update",
                    f'Trigger "{name}" tests whether column {column} changed, which only an'
                    " update can say.",
                    (*at, "when", column, "changed"),
                    hint="Give the trigger `on: [update]` alone, or drop `changed`.",
                )


def _input_problems(
    spec: model.FlowSpec, trigger: model.TriggerSpec, name: str, at: tuple[Any, ...], problem: Any
) -> Iterator[Problem]:
    schema = spec.input
    if schema is None:
        return
    types = [schema.type] if isinstance(schema.type, str) else schema.type
    if types is not None and "object" not in types:
        yield problem(
            "trigger_input_not_object",
            f'Trigger "{name}" starts runs with an object of columns, but the input of flow'
            f' "{spec.slug}" is {" or ".join(types)}.',
            (*at, "input"),
            hint="A flow started by a table trigger takes an object input.",
        )
        return
    properties = schema.properties or {}
    if schema.additional_properties is False:
        for key in trigger.input:
            if key not in properties:
                yield problem(
                    "unknown_trigger_input_key",
                    f'Trigger "{name}" maps input key "{key}", which the input of flow'
                    f' "{spec.slug}" does not take.',
                    (*at, "input", key),
                    hint=f"The input takes: {', '.join(sorted(properties)) or 'no key'}.",
                )
    for key in schema.required or []:
        if key not in trigger.input:
            yield problem(
                "unmapped_trigger_input_key",
                f'Trigger "{name}" does not map input key "{key}", which flow "{spec.slug}"'
                " requires.",
                (*at, "input"),
                hint=f"Map it to a column of {trigger.table}: `{key}: <column>`.",
            )

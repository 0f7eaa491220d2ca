"""Rules that need the whole flow: slugs, dependency order, map steps, conditions, workers and
(in step mode) the queue routes. Each broken rule becomes a located Problem; all are collected."""

from __future__ import annotations

import builtins
import difflib
import keyword
import re
from collections.abc import Iterator
from typing import Any

from pgflow_gen import naming
from pgflow_gen.errors import excerpt
from pgflow_gen.spec import json_values, model, schedule_checks, schema_checks, trigger_checks
from pgflow_gen.spec.locate import Locator
from pgflow_gen.spec.problems import Problem

ORDER_HINT = (
    "Steps are listed in dependency order: a step may only depend on steps listed above it."
)


def check(spec: model.FlowSpec, locator: Locator) -> list[Problem]:
    return list(_problems(spec, locator))


def _problems(spec: model.FlowSpec, locator: Locator) -> Iterator[Problem]:
    def problem(
        code: str,
        message: str,
        keys: tuple[str | int, ...],
        *,
        detail: str | None = None,
        hint: str | None = None,
        step: int | None = None,
    ) -> Problem:
        return Problem(
            code,
            message,
            locator.at(keys),
            detail=detail,
            hint=hint,
            flow_slug=spec.slug,
            step_slug=None if step is None else spec.steps[step].slug,
            step_index=step,
        )

    # The slug rules and their texts belong to `naming` (and its SQL twin).
    slug_errors = naming.slug_errors(spec.slug, [s.slug for s in spec.steps])
    for error in slug_errors:
        yield problem(
            error.code,
            error.message,
            ("slug",) if error.step_index is None else ("steps", error.step_index, "slug"),
            detail=error.detail,
            hint=error.hint,
            step=error.step_index,
        )
    slugs_ok = not slug_errors

    index_of = {step.slug: i for i, step in enumerate(spec.steps)}
    for listed, where in _retry_lists(spec):
        yield from _exception_name_problems(listed, where, problem)
    for index, step in enumerate(spec.steps):
        yield from _dependency_problems(spec, index, step, index_of, problem)
        yield from _step_kind_problems(index, step, problem)
        keywords = [
            part for part in re.split(r"[.:]", step.handler or "") if keyword.iskeyword(part)
        ]
        if keywords:
            yield problem(
                "invalid_handler_path",
                f"Invalid handler path {excerpt(repr(step.handler))}.",
                ("steps", index, "handler"),
                detail=f'"{keywords[0]}" is a Python keyword, so no import can name it.',
                hint='Write "package.module:function" with names Python can import.',
                step=index,
            )
        for key, pattern in (("if", step.if_), ("if_not", step.if_not)):
            bad = json_values.non_json(pattern)
            if bad is not None:
                yield problem(
                    "not_json",
                    f'"{key}" of step "{step.slug}" holds {bad}, which is not a JSON value.',
                    ("steps", index, key),
                    hint="Conditions are JSON containment patterns: use objects, arrays, strings,"
                    " finite numbers, booleans and null.",
                    step=index,
                )
        if (step.if_ is None and step.if_not is None) and step.when_unmet is not None:
            yield problem(
                "when_unmet_without_condition",
                f'Step "{step.slug}" sets when_unmet but has no condition.',
                ("steps", index, "when_unmet"),
                hint='Add "if" or "if_not", or remove "when_unmet".',
                step=index,
            )
        schemas = (
            (("output",), step.output),
            (("signal", "payload"), step.signal.payload if step.signal is not None else None),
        )
        for at, schema in schemas:
            if schema is not None:
                yield from schema_checks.problems(
                    schema, ("steps", index, *at), problem, step=index
                )

        if step.concurrency is not None and not re.fullmatch(
            model.CONCURRENCY_KEY_PATTERN, step.concurrency.key
        ):
            yield problem(
                "invalid_concurrency_key",
                f'Step "{step.slug}" has a concurrency key that is not a JSON path:'
                f" {excerpt(repr(step.concurrency.key))}.",
                ("steps", index, "concurrency", "key"),
                hint='Start at the run input with "$", then name fields and indexes, such as'
                ' "$.tenant_id" or "$.account.ids[0]".',
                step=index,
            )

    if spec.input is not None:
        yield from schema_checks.problems(spec.input, ("input",), problem)
    yield from schedule_checks.problems(spec, problem)
    yield from trigger_checks.problems(spec, problem)

    for slug in spec.workers.steps:
        if spec.queue_mode == "flow":
            yield problem(
                "worker_overrides_need_step_mode",
                f'Per-step worker settings for "{slug}" need queue_mode: step.',
                ("workers", "steps", slug),
                hint="In flow mode one worker serves every step: set workers.max_concurrent.",
            )
        elif slug not in index_of or not spec.steps[index_of[slug]].runs_handler:
            named = spec.steps[index_of[slug]] if slug in index_of else None
            what, detail = (
                ("which is not a step of this flow", None)
                if named is None
                else ("a signal step", "A signal step runs no task: no worker serves it.")
                if named.signal is not None
                else (
                    "a subflow step",
                    f"A subflow step's tasks are runs of flow \"{named.flow}\": that flow's"
                    " workers run them.",
                )
            )
            yield problem(
                "unknown_worker_step",
                f'workers.steps names "{slug}", {what}.',
                ("workers", "steps", slug),
                detail=detail,
                hint="Steps with workers: "
                f"{', '.join(s.slug for s in spec.steps if s.runs_handler) or '(none)'}.",
            )

    if slugs_ok:
        try:
            naming.resolve_queue_routes(spec.slug, [s.slug for s in spec.steps], spec.queue_mode)
        except naming.FlowSpecError as error:
            step_index = error.step_index if error.step_slug is not None else None
            keys: tuple[str | int, ...] = (
                ("steps", step_index, "slug") if step_index is not None else ("slug",)
            )
            if isinstance(error, naming.FlowQueueNameError | naming.EmptyStepQueuedFlowError):
                keys, step_index = ("slug",), None
            yield problem(
                error.code, error.message, keys,
                detail=error.detail, hint=error.hint, step=step_index,
            )  # fmt: skip


#: The keys a signal step cannot have (it runs no task), with what to do instead.
SIGNAL_STEP_KEYS = {
    "handler": "A signal step runs no handler: its output is the payload it receives. Remove"
    ' "handler", or "signal" to run a handler.',
    "type": "A signal step is a single step: map its payload in a step that depends on it.",
    "array": "A signal step is a single step: map its payload in a step that depends on it.",
    "output": 'Its output is the payload it receives: describe it in "signal.payload".',
    "options": 'It runs no task: set how long it waits with "signal.timeout".',
    "concurrency": "It runs no task: limit the steps that depend on it instead.",
}


#: The keys a subflow step cannot have (its tasks are runs of another flow), with what to do
#: instead. Its retries (max_attempts, base_delay) apply: a retry resumes the failed child run.
SUBFLOW_STEP_KEYS = {
    "handler": 'A subflow step runs no handler: its output is the output of a run of its "flow".'
    ' Remove "handler", or "flow" to run a handler.',
    "output": 'Its output is the output of a run of its "flow", typed by that flow\'s spec.',
    "concurrency": "Its tasks are runs of another flow: limit the steps of that flow instead.",
}
#: The options of a subflow step: how often, and how long after a failure, its child runs again.
SUBFLOW_OPTIONS = {"max_attempts", "base_delay"}


def _step_kind_problems(index: int, step: model.StepSpec, problem: Any) -> Iterator[Problem]:
    """A step runs a handler, waits for a signal, or runs another flow: exactly one; and a
    signal or subflow step has none of the keys that only a handler's task uses."""
    if step.flow is not None:
        yield from _subflow_problems(index, step, problem)
        return
    if step.signal is None:
        if step.handler is None:
            yield problem(
                "missing_key",
                'Missing required key "handler".',
                ("steps", index),
                hint='A step runs a handler ("handler: package.module:function"), waits for a'
                ' signal ("signal: {payload: ...}"), or runs another flow ("flow: <slug>").',
                step=index,
            )
        return
    present = {
        "handler": step.handler is not None,
        "output": step.output is not None,
        "options": bool(step.options.model_fields_set),
        "type": step.type != "single",
        "array": step.array is not None,
        "concurrency": step.concurrency is not None,
    }
    for key, hint in SIGNAL_STEP_KEYS.items():
        if present[key]:
            yield problem(
                "signal_step_key",
                f'Signal step "{step.slug}" cannot have "{key}".',
                ("steps", index, key),
                hint=hint,
                step=index,
            )


def _subflow_problems(index: int, step: model.StepSpec, problem: Any) -> Iterator[Problem]:
    """A subflow step names a valid flow slug, has at most one dependency unless it maps (its
    child's input is that dependency's output), and none of the keys only a handler uses."""
    assert step.flow is not None
    violation = naming.slug_violation(step.flow)
    if violation is not None:
        yield problem(
            "invalid_slug",
            f'Step "{step.slug}" runs flow {excerpt(repr(step.flow))}, which is not a valid slug.',
            ("steps", index, "flow"),
            detail=f"The slug is invalid: {violation}.",
            hint="Name the slug of another flow of this build.",
            step=index,
        )
    if step.signal is not None:
        yield problem(
            "subflow_step_key",
            f'Subflow step "{step.slug}" cannot have "signal".',
            ("steps", index, "signal"),
            hint='A step waits for a signal or runs another flow: remove "signal" or "flow".',
            step=index,
        )
    present = {
        "handler": step.handler is not None,
        "output": step.output is not None,
        "concurrency": step.concurrency is not None,
    }
    for key, hint in SUBFLOW_STEP_KEYS.items():
        if present[key]:
            yield problem(
                "subflow_step_key",
                f'Subflow step "{step.slug}" cannot have "{key}".',
                ("steps", index, key),
                hint=hint,
                step=index,
            )
    for option in sorted(step.options.model_fields_set - SUBFLOW_OPTIONS):
        yield problem(
            "subflow_step_key",
            f'Subflow step "{step.slug}" cannot have option "{option}".',
            ("steps", index, "options", option),
            detail="Its tasks are runs of another flow: no worker runs them, so a timeout, a"
            " start delay, limits or exception lists do not apply (set them on that flow's"
            " steps).",
            hint="A subflow step takes max_attempts and base_delay: a retry resumes the failed"
            " child run where it failed.",
            step=index,
        )
    if step.type == "single" and len(step.depends_on) > 1:
        yield problem(
            "subflow_step_dependencies",
            f'Subflow step "{step.slug}" has {len(step.depends_on)} dependencies; at most one.',
            ("steps", index, "depends_on"),
            detail="The child run's input is the output of its one dependency (or the run input"
            " when it has none).",
            hint="Gather what the child needs in one step, and depend on that step.",
            step=index,
        )


def _retry_lists(spec: model.FlowSpec) -> Iterator[tuple[list[str], tuple[str | int, ...]]]:
    """Every `retry.not_on` list of the spec, with where it is."""
    if spec.options.retry is not None:
        yield spec.options.retry.not_on, ("options", "retry", "not_on")
    for index, step in enumerate(spec.steps):
        if step.options.retry is not None:
            yield step.options.retry.not_on, ("steps", index, "options", "retry", "not_on")


def _exception_name_problems(
    listed: list[str], keys: tuple[str | int, ...], problem: Any
) -> Iterator[Problem]:
    """Each entry names a builtin exception class, or is a `package.module:Class` path (which
    the worker imports when it starts)."""
    step = keys[1] if keys[0] == "steps" and isinstance(keys[1], int) else None
    for position, name in enumerate(listed):
        if re.fullmatch(model.HANDLER_PATTERN, name) and not any(
            keyword.iskeyword(part) for part in re.split(r"[.:]", name)
        ):
            continue
        found = getattr(builtins, name, None)
        if isinstance(found, type) and issubclass(found, BaseException):
            continue
        near = difflib.get_close_matches(name, _BUILTIN_EXCEPTIONS, n=1)
        yield problem(
            "invalid_exception_name",
            f"{excerpt(repr(name))} names no exception class.",
            (*keys, position),
            hint=(f'Did you mean "{near[0]}"? ' if near else "")
            + 'Name a builtin exception ("ValueError") or write "package.module:ExceptionClass".',
            step=step,
        )


_BUILTIN_EXCEPTIONS = sorted(
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
)


def _dependency_problems(
    spec: model.FlowSpec, index: int, step: model.StepSpec, index_of: dict[str, int], problem: Any
) -> Iterator[Problem]:
    keys = ("steps", index)
    if step.type == "single" and step.array is not None:
        yield problem(
            "array_on_single_step",
            f'Step "{step.slug}" sets "array" but is not a map step.',
            (*keys, "array"),
            hint='Add "type: map", or remove "array".',
            step=index,
        )
    dependencies = list(step.depends_on)
    if step.type == "map":
        if len(dependencies) > 1:
            yield problem(
                "map_step_dependencies",
                f'Map step "{step.slug}" has {len(dependencies)} dependencies; at most one.',
                (*keys, "depends_on"),
                hint='A map step maps the array output of its one dependency, named in "array".',
                step=index,
            )
        elif (
            dependencies
            and step.array != dependencies[0]
            # A dependency that is no step is reported as unknown (below), and only that: a
            # hint to name it in "array" would copy its typo.
            and dependencies[0] in index_of
        ):
            yield problem(
                "map_step_array",
                f'Map step "{step.slug}" must name its dependency "{dependencies[0]}" in "array".',
                (*keys, "array" if step.array is not None else "depends_on"),
                hint=f'Write "array: {dependencies[0]}" (depends_on may then be left out).',
                step=index,
            )
        elif step.array is not None and not dependencies:
            dependencies = [step.array]
        mapped = spec.steps[index_of[step.array]] if step.array in index_of else None
        # A map step's output is the array of its tasks' outputs, whatever each one is.
        declared = (
            mapped.output.type
            if mapped is not None and mapped.output and mapped.type != "map"
            else None
        )
        if mapped is not None and mapped.step_type == "subflow":
            yield problem(
                "map_array_not_array",
                f'Map step "{step.slug}" maps the output of "{step.array}", which is not an array.',
                (*keys, "array"),
                detail=f'"{step.array}" is a subflow step: its output is the output of a run of'
                f' flow "{mapped.flow}", an object.',
                hint="Map a step whose output is an array (a subflow map step's is: its runs'"
                " outputs).",
                step=index,
            )
        elif declared is not None and declared != "array" and "array" not in declared:
            yield problem(
                "map_array_not_array",
                f'Map step "{step.slug}" maps the output of "{step.array}", which is not an array.',
                (*keys, "array"),
                detail=f'The output type of "{step.array}" is {declared}.',
                hint=f'Map a step whose output is "type: array", or declare "{step.array}"\'s'
                " output as the array to map.",
                step=index,
            )
        if step.array is None and not step.depends_on:
            input_type = spec.input.type if spec.input is not None else None
            if spec.input is not None and input_type != "array":
                yield problem(
                    "root_map_needs_array_input",
                    f'Map step "{step.slug}" maps the run input, which is not an array.',
                    ("input",),
                    detail=f"The flow input type is {input_type or 'unspecified'}.",
                    hint='Declare "input: {type: array, items: ...}", or set "array" to a step.',
                    step=index,
                )
    counted: set[str] = set()
    for position, dep in enumerate(dependencies):
        where = (*keys, "depends_on", position) if dep in step.depends_on else (*keys, "array")
        if dep in counted:
            yield problem(
                "duplicate_dependency", f'Step "{step.slug}" lists "{dep}" twice.', where,
                step=index,
            )  # fmt: skip
            continue
        counted.add(dep)
        if dep == step.slug:
            yield problem(
                "self_dependency", f'Step "{step.slug}" depends on itself.', where, step=index
            )
        elif dep not in index_of:
            near = [s for s in index_of if s.lower() == dep.lower()]
            near = near or difflib.get_close_matches(dep, [s for s in index_of if s != dep], n=1)
            yield problem(
                "unknown_dependency",
                f'Step "{step.slug}" depends on "{dep}", which is not a step of this flow.',
                where,
                hint=f'Did you mean "{near[0]}"? Slugs are exact.' if near else ORDER_HINT,
                step=index,
            )
        elif index_of[dep] > index:
            yield problem(
                "dependency_order",
                f'Step "{step.slug}" depends on "{dep}", which is listed after it.',
                where,
                hint=ORDER_HINT,
                step=index,
            )
    if all(dep in index_of for dep in dependencies):  # else the unknown one explains the rest
        yield from _condition_problems(step, index, dependencies, problem)


def _condition_problems(
    step: model.StepSpec, index: int, dependencies: list[str], problem: Any
) -> Iterator[Problem]:
    """A dependent step's condition matches the object of its dependencies' outputs, keyed by
    their slugs: a key that is none of them never matches, so the step would always be unmet."""
    if not dependencies:
        return  # a root step's condition matches the run input: any keys
    for key, pattern in (("if", step.if_), ("if_not", step.if_not)):
        for name in pattern or {}:
            if name in dependencies:
                continue
            near = difflib.get_close_matches(name, dependencies, n=1)
            yield problem(
                "condition_unknown_dependency",
                f'The "{key}" condition of step "{step.slug}" names "{name}", which is not one'
                " of its dependencies.",
                ("steps", index, key, name),
                detail="A dependent step's condition matches its dependencies' outputs, keyed by"
                f" their slugs: {', '.join(dependencies)}.",
                hint=f'Did you mean "{near[0]}"? Slugs are exact.'
                if near
                else "Name a dependency, or add the step to depends_on.",
                step=index,
            )

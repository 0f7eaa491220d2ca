"""The `Flow(...)` definition a generated module holds: each step's `Step(...)` arguments, the
flow's schedules, and the shape each compiles to (as `Step.shape()` gives it at run time)."""

from __future__ import annotations

from typing import Any

from pgflow_gen import shape as shapes
from pgflow_gen.codegen import layout, literals, step_rules
from pgflow_gen.spec import model


def schedules_arg(spec: model.FlowSpec) -> str | None:
    """`schedules=(Schedule(name=..., cron=..., ...),),` for the Flow(...) call: every field
    that differs from its default, and the name always."""
    if not spec.schedules:
        return None
    calls = []
    for index, schedule in enumerate(spec.schedules):
        args = [
            layout.Pair("name", "=", layout.Atom(literals.string(schedule.resolved_name(index)))),
            layout.Pair("cron", "=", layout.Atom(literals.string(schedule.cron))),
        ]
        if schedule.input != {}:
            args.append(layout.Pair("input", "=", literals.value(schedule.input)))
        if schedule.timezone != "UTC":
            args.append(
                layout.Pair("timezone", "=", layout.Atom(literals.string(schedule.timezone)))
            )
        if schedule.catch_up != "none":
            args.append(
                layout.Pair("catch_up", "=", layout.Atom(literals.string(schedule.catch_up)))
            )
        if schedule.priority:
            args.append(layout.Pair("priority", "=", layout.Atom(str(schedule.priority))))
        calls.append(layout.Group("Schedule", "(", ")", tuple(args)))
    return layout.text(
        layout.Pair("schedules", "=", layout.Group("", "(", ")", tuple(calls))),
        indent=4,
        suffix=",",
    )


def shape_step(step: model.StepSpec, dependencies: tuple[str, ...]) -> dict[str, Any]:
    """The step as `Step.shape()` gives it at run time (a test keeps the two equal): a signal
    step has one option, its timeout, and always a payload schema ({}: any JSON)."""
    options = engine_options(step)
    return shapes.step(
        slug=step.slug,
        step_type=step.step_type,
        dependencies=dependencies,
        when_unmet=step.when_unmet or "skip",
        when_exhausted=step.when_exhausted,
        required_input_pattern=step.if_,
        forbidden_input_pattern=step.if_not,
        max_attempts=options.get("max_attempts"),
        base_delay=options.get("base_delay"),
        timeout=options.get("timeout"),
        start_delay=options.get("start_delay"),
        max_in_flight=options.get("max_in_flight"),
        rate_limit=options.get("rate_limit"),
        rate_period=options.get("rate_period"),
        concurrency_key=step.concurrency.key if step.concurrency else None,
        concurrency_limit=step.concurrency.max_in_flight if step.concurrency else None,
        payload_schema=None if step.signal is None else schema(step.signal.payload) or {},
        subflow_slug=step.flow,
    )


def engine_options(step: model.StepSpec) -> dict[str, int | None]:
    """The options the engine keeps for the step: a signal step's one is how long it waits."""
    if step.signal is not None:
        return {"timeout": step.signal.timeout}
    return step.options.engine_options()


def schema(schema: model.TypeSchema | None) -> dict[str, Any] | None:
    return None if schema is None else schema.as_json()


def retry_not_on(retry: model.RetryOptions | None) -> tuple[layout.Pair, ...]:
    """`retry_not_on=("ValueError", ...)` of a FlowOptions or StepOptions call, when set."""
    if retry is None:
        return ()
    names_ = tuple(layout.Atom(literals.string(name)) for name in retry.not_on)
    return (layout.Pair("retry_not_on", "=", layout.Group("", "(", ")", names_)),)


def step_definition(step: model.StepSpec) -> tuple[layout.Expr, ...]:
    """The keyword arguments of this step's `Step(...)` call."""
    dependencies = step_rules.dependencies(step)

    def arg(name: str, value: layout.Expr) -> layout.Pair:
        return layout.Pair(name, "=", value)

    def quoted(text: str) -> layout.Atom:
        return layout.Atom(literals.string(text))

    args = [arg("slug", quoted(step.slug))]
    if step.step_type != "single":
        args.append(arg("step_type", quoted(step.step_type)))
    if dependencies:
        args.append(
            arg("dependencies", layout.Group("", "(", ")", tuple(map(quoted, dependencies))))
        )
    if step.flow is not None:
        args.append(arg("subflow_slug", quoted(step.flow)))
    if step.when_unmet not in (None, "skip"):
        args.append(arg("when_unmet", quoted(step.when_unmet)))
    if step.when_exhausted != "fail":
        args.append(arg("when_exhausted", quoted(step.when_exhausted)))
    if step.if_ is not None:
        args.append(arg("required_input_pattern", literals.value(step.if_)))
    if step.if_not is not None:
        args.append(arg("forbidden_input_pattern", literals.value(step.if_not)))
    options = tuple(
        arg(key, layout.Atom(str(value)))
        for key, value in engine_options(step).items()
        if value is not None
    ) + retry_not_on(step.options.retry)
    if step.concurrency is not None:
        options += (
            arg("concurrency_key", quoted(step.concurrency.key)),
            arg("concurrency_limit", layout.Atom(str(step.concurrency.max_in_flight))),
        )
    if options:
        args.append(arg("options", layout.Group("StepOptions", "(", ")", options)))
    output = schema(step.output)
    if output is not None:
        args.append(arg("output_schema", literals.value(output)))
    payload = schema(step.signal.payload) if step.signal is not None else None
    if payload is not None:
        args.append(arg("payload_schema", literals.value(payload)))
    return tuple(args)

"""View models: everything a template prints, computed here so templates decide nothing."""

from __future__ import annotations

import json
from dataclasses import dataclass

from pgflow_gen import naming
from pgflow_gen import shape as shapes
from pgflow_gen.codegen import declarations, definition, layout, literals, names, step_rules
from pgflow_gen.codegen.layout import Atom
from pgflow_gen.codegen.types import (
    AliasDecl,
    Decl,
    Field,
    TypeBuilder,
    TypedDictDecl,
    subscript,
)
from pgflow_gen.spec import model


@dataclass(frozen=True)
class StepView:
    slug: str
    module: str
    handler_module: str
    handler_reference: str
    handler_attr: str
    output_name: str
    handler_name: str
    first_param: str
    input_annotation: str
    queue_name: str
    max_concurrent: int

    @property
    def handler_expression(self) -> str:
        return f"{self.handler_reference}.{self.handler_attr}"

    @property
    def handler_entry(self) -> str:
        """`"slug": module.function,` in a flow-mode worker's HANDLERS (inside its `try:`)."""
        entry = layout.Pair(literals.string(self.slug), ": ", layout.Atom(self.handler_expression))
        return layout.text(entry, indent=8, suffix=",")

    @property
    def handler_typevar(self) -> str:
        """The private TypeVar bound to this step's Protocol, which its `Steps` decorator takes
        and returns (so the decorated function keeps its own, precise type). mypy names it in
        its error, so its name says what was expected: `Value of type variable
        "_MustBeClassifyHandler" of "classify" of "Steps" cannot be "Callable[..., int]"`."""
        return f"_MustBe{self.handler_name}"

    @property
    def handler_typevar_line(self) -> str:
        call = layout.Group(
            "TypeVar",
            "(",
            ")",
            (
                layout.Atom(literals.string(self.handler_typevar)),
                layout.Pair("bound", "=", layout.Atom(self.handler_name)),
            ),
        )
        return layout.text(call, indent=0, prefix=f"{self.handler_typevar} = ")

    @property
    def handler_assignment(self) -> str:
        """`HANDLER: <Protocol> = module.function` in a step worker's entry file (inside the
        `try:` that reports a handler that does not import)."""
        return layout.text(
            layout.Atom(self.handler_expression),
            indent=4,
            prefix=f"HANDLER: {self.handler_name} = ",
        )

    @property
    def handler_path(self) -> str:
        """The spec's `handler:`, `package.module:function`."""
        return f"{self.handler_module}:{self.handler_attr}"

    @property
    def handler_import(self) -> str:
        alias = self.handler_reference
        return f"import {self.handler_module}" + (
            "" if alias == self.handler_module else f" as {alias}"
        )


@dataclass(frozen=True)
class FlowView:
    slug: str
    module: str
    source: str
    queue_mode: str
    default_queue: str
    docstring: str
    package: str
    #: The steps that run a handler (every step but signal and subflow steps), in step order.
    steps: tuple[StepView, ...]
    #: For every step, the keyword arguments of its `Step(...)` call, laid out one per line.
    definitions: tuple[tuple[str, ...], ...]
    #: The signal steps: (attribute of `Signals`, step slug, payload type), in step order.
    signals: tuple[tuple[str, str, str], ...]
    #: The imports of the flow modules its subflow steps run (their types), one line each.
    subflow_imports: tuple[str, ...]
    decls: tuple[tuple[int, Decl], ...]
    handlers: TypedDictDecl
    typing_imports: tuple[str, ...]
    runtime_imports: tuple[str, ...]
    #: pyright settings of the module: a JSON property named "" is a TypedDict key that pyright
    #: rejects ("Names within a TypedDict cannot be empty"); Python and mypy accept it.
    pyright_comment: str | None
    step_slug_members: tuple[str, ...]
    all_names: tuple[str, ...]
    flow_options: str
    #: `input_schema={...},` for the Flow(...) call (its first line; the rest indented), or None.
    input_schema_arg: str | None
    #: `schedules=(Schedule(...), ...),` for the Flow(...) call, or None without schedules.
    schedules_arg: str | None
    max_concurrent: int
    shape_json: str
    route_map_json: str | None
    #: The table triggers as pgflow.set_flow_triggers takes them, or None without any.
    triggers_json: str | None

    def import_failure_exit(self, steps: tuple[StepView, ...]) -> str:
        """`sys.exit(handler_import_failed({step: handler path}, source, exc))`: what an entry
        file does when the handlers of `steps` do not import (inside its `except`)."""
        paths = layout.Group(
            "",
            "{",
            "}",
            tuple(
                layout.Pair(
                    literals.string(step.slug),
                    ": ",
                    layout.Atom(literals.string(step.handler_path)),
                )
                for step in steps
            ),
        )
        call = layout.Group(
            "handler_import_failed",
            "(",
            ")",
            (paths, layout.Atom(literals.string(self.source)), layout.Atom("exc")),
        )
        return layout.text(layout.Group("sys.exit", "(", ")", (call,)), indent=4)

    @property
    def handler_import_blocks(self) -> tuple[tuple[str, ...], ...]:
        """The handler imports of a flow-mode worker in ruff's (isort's) sections: other
        packages first, then those of the package the code is generated into (first-party, as
        ruff detects them in a project whose generated package sits inside its own)."""
        top = self.package.split(".")[0]
        imports = {step.handler_module: step.handler_import for step in self.steps}
        modules = sorted(imports, key=names.import_order)
        own = [imports[m] for m in modules if m.split(".")[0] == top]
        others = [imports[m] for m in modules if m.split(".")[0] != top]
        return tuple(tuple(block) for block in (others, own) if block)


def flow_names(spec: model.FlowSpec) -> tuple[str, tuple[names.StepNames, ...]]:
    """The flow's module and every step's contract names."""
    return names.flow_module(spec.slug), tuple(
        names.step_names(
            step.slug,
            index,
            is_map=step.type == "map",
            has_dependencies=bool(step_rules.dependencies(step)),
            is_signal=step.signal is not None,
            is_subflow=step.flow is not None,
        )
        for index, step in enumerate(spec.steps)
    )


def build(spec: model.FlowSpec, *, source: str, package: str) -> FlowView:
    module, step_names = flow_names(spec)
    builder = TypeBuilder(names.NameAllocator(name for step in step_names for name in step.types()))
    scopes = {"": builder.named("Input", spec.input)}
    index_of = {step.slug: i for i, step in enumerate(spec.steps)}

    # Output types first: dependents refer to them. A subflow step's is its child's `Output`.
    for step, step_name in zip(spec.steps, step_names, strict=True):
        if step.flow is not None:
            child = Atom(f"{subflow_alias(step.flow)}.Output")
            scopes[step.slug] = {}
            if step_name.item_output is None:
                builder.declare(AliasDecl(step_name.output, child))
            else:
                builder.declare(AliasDecl(step_name.item_output, child))
                builder.declare(
                    AliasDecl(step_name.output, subscript("list", Atom(step_name.item_output)))
                )
        elif step_name.item_output is not None:
            scopes[step.slug] = builder.named(step_name.item_output, step.output)
            builder.declare(
                AliasDecl(step_name.output, subscript("list", layout.Atom(step_name.item_output)))
            )
        elif step.signal is not None:  # its output is the payload it receives
            scopes[step.slug] = builder.named(step_name.output, step.signal.payload)
        else:
            scopes[step.slug] = builder.named(step_name.output, step.output)

    routes = naming.resolve_queue_routes(spec.slug, [s.slug for s in spec.steps], spec.queue_mode)
    # The steps that run a handler: every step but the signal and subflow steps.
    handled = [
        (step, step_name, route, step.handler)
        for step, step_name, route in zip(spec.steps, step_names, routes, strict=True)
        if step.handler is not None and step_name.handler is not None
    ]
    handler_modules = [handler.partition(":")[0] for *_, handler in handled]
    # Step mode: one handler per file; flow mode: every handler in one file.
    references = {
        step.slug: (
            names.handler_imports(handler_modules, [])
            if spec.queue_mode == "flow"
            else names.handler_imports([module], [step_name.handler])
        )[module]
        for (step, step_name, *_), module in zip(handled, handler_modules, strict=True)
        if step_name.handler is not None
    }
    steps = []
    for step, step_name, route, handler in handled:
        assert step_name.handler is not None  # a handled step has one
        dependencies = step_rules.dependencies(step)
        if step_name.item is not None and step_name.item_output is not None:
            source_type = declarations.element_type(
                spec, step, builder, step_names, index_of, scopes
            )
            first_param, annotation = "item", source_type
            output = step_name.item_output
        elif step_name.deps is not None:
            declarations.declare_deps(
                builder, step_name.deps, dependencies, spec, step_names, index_of
            )
            first_param, annotation, output = "deps", step_name.deps, step_name.output
        else:
            first_param, annotation, output = "flow_input", "Input", step_name.output
        module_name, _, attr = handler.partition(":")
        steps.append(
            StepView(
                slug=step.slug,
                module=step_name.module,
                handler_module=module_name,
                handler_reference=references[step.slug],
                handler_attr=attr,
                output_name=output,
                handler_name=step_name.handler,
                first_param=first_param,
                input_annotation=annotation,
                queue_name=route.queue_name,
                max_concurrent=_max_concurrent(spec, step.slug),
            )
        )

    declarations.declare_output(builder, spec, step_names, index_of)
    definitions = tuple(
        tuple(layout.text(arg, indent=12, suffix=",") for arg in definition.step_definition(step))
        for step in spec.steps
    )
    signals = tuple(
        (step_name.module, step.slug, step_name.output)
        for step, step_name in zip(spec.steps, step_names, strict=True)
        if step.signal is not None
    )

    # Names the declarations refer to (not text inside string literals: an enum may hold "Json").
    used = {s.input_annotation for s in steps}.union(
        *(declarations.decl_names(d) for d in builder.decls)
    )
    typing_imports = ["Final", "Literal"]
    if steps:
        typing_imports += ["Protocol", "TypeVar"]
    if any(isinstance(decl, AliasDecl) for decl in builder.decls):
        typing_imports.append("TypeAlias")
    if not spec.steps:
        typing_imports.append("Never")
        if "Literal" not in used:
            typing_imports.remove("Literal")
    if "NotRequired" in used:
        typing_imports.append("NotRequired")
    runtime_imports = ["Flow", "FlowOptions", "TypedDict"]
    if spec.steps:
        runtime_imports.append("Step")
    if steps:
        runtime_imports += ["Context", "MaybeAwaitable"]
    if signals:
        runtime_imports.append("Signal")
    if "Json" in used:
        runtime_imports.append("Json")
    if any(line.startswith("options=") for lines in definitions for line in lines):
        runtime_imports.append("StepOptions")
    if spec.schedules:
        runtime_imports.append("Schedule")
    if spec.queue_mode == "step":
        runtime_imports += ["StepQueuedFlow", "with_step_queues"]
    runtime_imports += ["handler_import_failed", "run_main", "start_worker"]

    input_schema = None if spec.input is None else spec.input.as_json()
    flow_shape = shapes.flow(
        [definition.shape_step(s, step_rules.dependencies(s)) for s in spec.steps],
        max_attempts=spec.options.max_attempts,
        base_delay=spec.options.base_delay,
        timeout=spec.options.timeout,
        input_schema=input_schema,
        schedules=[
            shapes.schedule(
                name=schedule.resolved_name(index), cron=schedule.cron, input=schedule.input,
                timezone=schedule.timezone, catch_up=schedule.catch_up,
                priority=schedule.priority,
            )
            for index, schedule in enumerate(spec.schedules)
        ],
    )  # fmt: skip
    route_map = naming.route_map(routes) if spec.queue_mode == "step" else None
    empty_key = any(
        isinstance(decl, TypedDictDecl) and any(f.key == "" for f in decl.fields)
        for decl in builder.decls
    )
    return FlowView(
        pyright_comment="# pyright: reportGeneralTypeIssues=false" if empty_key else None,
        slug=spec.slug,
        module=module,
        source=source,
        queue_mode=spec.queue_mode,
        default_queue=naming.default_queue_name(spec.slug),
        docstring=literals.docstring(
            spec.description,
            indent=0,
            lead=f'Typed definition of flow "{spec.slug}" (queue mode: {spec.queue_mode}).',
        )
        or "",
        package=package,
        steps=tuple(steps),
        definitions=definitions,
        signals=signals,
        subflow_imports=tuple(
            _subflow_import(child)
            for child in sorted({s.flow for s in spec.steps if s.flow is not None})
        ),
        decls=declarations.spaced(builder.decls),
        handlers=TypedDictDecl(
            "Handlers",
            tuple(Field(view.slug, layout.Atom(view.handler_name), True) for view in steps),
        ),
        typing_imports=tuple(sorted(typing_imports)),
        runtime_imports=tuple(_isort_names(runtime_imports)),
        step_slug_members=tuple(json.dumps(s.slug) for s in spec.steps),
        all_names=tuple(
            _isort_names(
                [
                    "FLOW",
                    *(["STEP_QUEUED_FLOW"] if spec.queue_mode == "step" else []),
                    "Handlers",
                    "StepSlug",
                    *(["Steps"] if steps else []),
                    *(["Signals"] if signals else []),
                    *(decl.name for decl in builder.decls),
                    *(view.handler_name for view in steps),
                    "handler_import_failed",
                    "run_main",
                    "start_worker",
                ]
            )
        ),
        flow_options=layout.text(
            layout.Group(
                "FlowOptions",
                "(",
                ")",
                (
                    layout.Pair("max_attempts", "=", layout.Atom(str(spec.options.max_attempts))),
                    layout.Pair("base_delay", "=", layout.Atom(str(spec.options.base_delay))),
                    layout.Pair("timeout", "=", layout.Atom(str(spec.options.timeout))),
                    *definition.retry_not_on(spec.options.retry),
                ),
            ),
            indent=4,
            prefix="options=",
            suffix=",",
        ),
        input_schema_arg=None
        if input_schema is None
        else layout.text(
            layout.Pair("input_schema", "=", literals.value(input_schema)), indent=4, suffix=","
        ),
        schedules_arg=definition.schedules_arg(spec),
        max_concurrent=spec.workers.max_concurrent,
        shape_json=json.dumps(flow_shape, indent=2, sort_keys=True),
        route_map_json=None if route_map is None else json.dumps(route_map, indent=2),
        triggers_json=json.dumps(
            [trigger.as_json(index) for index, trigger in enumerate(spec.triggers)],
            indent=2,
            sort_keys=True,
        )
        if spec.triggers
        else None,
    )


def subflow_alias(flow_slug: str) -> str:
    """The name a generated module imports the module of flow `flow_slug` as (a suffix no
    other module-level name has, so no flow's module name can clash with one)."""
    return f"{names.flow_module(flow_slug)}_flow"


def _subflow_import(flow_slug: str) -> str:
    """A relative import, as the worker entry files import their flow module: it does not
    depend on the package's name, and ruff sorts it last whatever it takes for first-party."""
    return f"from . import {names.flow_module(flow_slug)} as {subflow_alias(flow_slug)}"


def _max_concurrent(spec: model.FlowSpec, step_slug: str) -> int:
    override = spec.workers.steps.get(step_slug)
    if override is not None and override.max_concurrent is not None:
        return override.max_concurrent
    return spec.workers.max_concurrent


def _isort_names(items: list[str]) -> list[str]:
    """The order ruff gives imported names and `__all__`: CONSTANTS, Classes, functions, each
    with numbers compared by value."""

    def key(name: str) -> tuple[int, names.NaturalKey]:
        group = 0 if name.isupper() else 1 if name[0].isupper() else 2
        return (group, names.natural(name))

    return sorted(items, key=key)

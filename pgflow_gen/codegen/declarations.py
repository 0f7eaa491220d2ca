"""The TypedDicts a generated module declares for a flow's data (a map step's element, a step's
dependencies, the flow's output), the names they use, and their spacing."""

from __future__ import annotations

from pgflow_gen.codegen import layout, names, step_rules
from pgflow_gen.codegen.types import AliasDecl, Decl, Field, Scope, TypeBuilder, TypedDictDecl
from pgflow_gen.spec import model


def element_type(
    spec: model.FlowSpec,
    step: model.StepSpec,
    builder: TypeBuilder,
    step_names: tuple[names.StepNames, ...],
    index_of: dict[str, int],
    scopes: dict[str, Scope],
) -> str:
    """The type of one element of the array a map step maps, resolved in its schema's scope."""
    if step.array is None:
        schema, scope = spec.input, scopes[""]
    else:
        source = spec.steps[index_of[step.array]]
        source_names = step_names[index_of[source.slug]]
        if source_names.item_output is not None:
            return source_names.item_output
        schema, scope = source.output, scopes[source.slug]
    item = step_names[index_of[step.slug]].item
    if schema is None or schema.items is None or item is None:
        return "Json"
    builder.named(item, schema.items, scope)
    return item


def declare_deps(
    builder: TypeBuilder,
    name: str,
    dependencies: tuple[str, ...],
    spec: model.FlowSpec,
    step_names: tuple[names.StepNames, ...],
    index_of: dict[str, int],
) -> None:
    builder.declare(
        TypedDictDecl(
            name,
            tuple(
                Field(
                    dep,
                    layout.Atom(step_names[index_of[dep]].output),
                    not step_rules.skippable(spec.steps[index_of[dep]]),
                )
                for dep in dependencies
            ),
        )
    )


def declare_output(
    builder: TypeBuilder,
    spec: model.FlowSpec,
    step_names: tuple[names.StepNames, ...],
    index_of: dict[str, int],
) -> None:
    has_dependents = {dep for step in spec.steps for dep in step_rules.dependencies(step)}
    fields = tuple(
        Field(
            step.slug,
            layout.Atom(step_names[index].output),
            not (step_rules.may_vanish(step) or step_rules.ancestor_cascades(spec, step, index_of)),
        )
        for index, step in enumerate(spec.steps)
        if step.slug not in has_dependents
    )
    builder.declare(TypedDictDecl("Output", fields))


def decl_names(decl: Decl) -> set[str]:
    if isinstance(decl, AliasDecl):
        return layout.names(decl.annotation)
    return set().union(*(layout.names(f.rendered) for f in decl.fields))


def spaced(decls: list[Decl]) -> tuple[tuple[int, Decl], ...]:
    """Each declaration with the blank lines before it: two around classes, one between aliases."""
    spaced = []
    previous_is_class = False
    for decl in decls:
        is_class = isinstance(decl, TypedDictDecl) and decl.class_syntax
        spaced.append((2 if is_class or previous_is_class else 1, decl))
        previous_is_class = is_class
    return tuple(spaced)

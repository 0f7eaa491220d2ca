"""Problems only the generator can see: two slugs that derive one generated name, within a flow
(`fooBar` and `foo_bar` both give `FooBarOutput`) or across the flows of one build (`sameFlow`
and `SameFlow`), and names or handler paths too long for the generated lines. `pgflow-gen
validate` reports them too, so validate accepts exactly the specs that build accepts."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from pgflow_gen.codegen import names, views
from pgflow_gen.errors import excerpt
from pgflow_gen.spec import model
from pgflow_gen.spec.locate import Locator
from pgflow_gen.spec.problems import Problem


@dataclass(frozen=True)
class LoadedSpec:
    """A valid spec, the path it was read from and its name in messages and headers."""

    path: Path
    source: str
    spec: model.FlowSpec

    @functools.cached_property
    def locator(self) -> Locator:
        """Positions in the file, read once and only when a problem needs one."""
        return Locator(self.source, self.path.read_text(encoding="utf-8"))


def problems(loaded: Sequence[LoadedSpec]) -> list[Problem]:
    found = [p for item in loaded for p in _within_flow(item)]
    return found + list(_across_flows(loaded))


def _too_long(
    what: str, name: str, keys: tuple[str | int, ...], item: LoadedSpec, step: int | None
) -> Problem:
    return Problem(
        "name_too_long",
        f'{what} gives the generated name "{name}" of {len(name)} characters;'
        f" at most {names.MAX_NAME_LENGTH} are allowed.",
        item.locator.at(keys),
        detail="Generated names must fit the line length wherever they appear.",
        hint="Shorten the slug.",
        flow_slug=item.spec.slug,
        step_slug=None if step is None else item.spec.steps[step].slug,
        step_index=step,
    )


def _within_flow(item: LoadedSpec) -> Iterator[Problem]:
    spec = item.spec
    module, step_names = views.flow_names(spec)
    if len(module) > names.MAX_NAME_LENGTH:
        yield _too_long(f'Flow slug "{spec.slug}"', module, ("slug",), item, None)
    for step in step_names:
        longest = step.longest()
        if len(longest) > names.MAX_NAME_LENGTH:
            keys = ("steps", step.index, "slug")
            yield _too_long(f'Step slug "{step.slug}"', longest, keys, item, step.index)
    for index, step_spec in enumerate(spec.steps):
        if step_spec.handler is not None and len(step_spec.handler) > names.MAX_HANDLER_LENGTH:
            yield Problem(
                "name_too_long",
                f"The handler path {excerpt(repr(step_spec.handler), 200)}"
                f" has {len(step_spec.handler)} characters;"
                f" at most {names.MAX_HANDLER_LENGTH} are allowed.",
                item.locator.at(("steps", index, "handler")),
                detail="The worker entry file imports it on one line.",
                hint="Shorten the module path, or re-export the function from a shorter module.",
                flow_slug=spec.slug,
                step_slug=step_spec.slug,
                step_index=index,
            )
    clashes = names.collisions(step_names, step_modules=spec.queue_mode == "step")
    if not clashes:
        return
    for clash in clashes:
        first, second = spec.steps[clash.first], spec.steps[clash.second]
        yield Problem(
            "name_collision",
            f'Steps "{first.slug}" (step {clash.first}) and "{second.slug}" (step'
            f' {clash.second}) both generate the {clash.kind} name "{clash.name}".',
            item.locator.at(("steps", clash.second, "slug")),
            detail="Generated names come from the slugs: types from the PascalCase form"
            f' ("{names.pascal_case(second.slug)}..."), worker modules from the snake_case form'
            f' ("{names.snake_case(second.slug)}").',
            hint="Rename one of the steps so that their PascalCase and snake_case forms differ.",
            flow_slug=spec.slug,
            step_slug=second.slug,
            step_index=clash.second,
        )


def _across_flows(loaded: Sequence[LoadedSpec]) -> Iterator[Problem]:
    seen: dict[tuple[str, str], LoadedSpec] = {}
    for item in loaded:
        slug = item.spec.slug
        keys = [
            ("flow slug ignoring case", slug.lower()),
            ("flow module", names.flow_module(slug)),
        ]
        for kind, key in keys:
            first = seen.setdefault((kind, key), item)
            if first is item:
                continue
            yield Problem(
                "name_collision",
                f'Flow "{slug}" and flow "{first.spec.slug}" of {first.source} share the'
                f' {kind} "{key}".',
                item.locator.at(("slug",)),
                detail="Flow slugs are unique ignoring case across a database, and every flow"
                " of a build gets a module named after the snake_case form of its slug.",
                hint="Give every concrete flow its own slug.",
                flow_slug=slug,
            )
            break

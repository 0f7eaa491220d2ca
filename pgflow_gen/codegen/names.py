"""Every derived identifier, computed in one place (and golden-tested through the output).

A flow's names come in two kinds. *Contract* names are documented (DESIGN.md section 3) and
derived from the slugs alone: flow and step modules, `<Step>Output`, `<Step>Handler`,
`<Step>Deps`, `<Step>Item`, `<Step>ItemOutput`, and the fixed `Input`, `Output`, `Handlers`,
`StepSlug`, `FLOW`. Two slugs that give one contract name (`fooBar` and `foo_bar` both give
`FooBarOutput` and the module `foo_bar`) are a spec problem that `validate` reports. *Nested*
names (TypedDicts for nested objects, `$defs` entries) are derived from their place in a schema
and made unique deterministically (`InputAddress`, then `InputAddress2`), never clashing with a
contract name.
"""

from __future__ import annotations

import keyword
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_WORD_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")

# Longer names would not fit the line length in every place they appear (a spec problem for
# contract names; nested names are shortened).
MAX_NAME_LENGTH = 64
# A handler path ("package.module:function") stands on one line of a worker entry file.
MAX_HANDLER_LENGTH = 76
# Module names of the output folder that a flow module must not take.
RESERVED_MODULES = frozenset({"workers", "migrations"})
# Names every flow module defines or imports besides its types.
FIXED_NAMES = (
    "FLOW",
    "STEP_QUEUED_FLOW",
    "Handlers",
    "Input",
    "Output",
    "StepSlug",
    "Steps",
    # imports of the flow module (typing and pgflow_gen.runtime)
    "Context",
    "Final",
    "Flow",
    "FlowOptions",
    "Json",
    "Literal",
    "MaybeAwaitable",
    "Never",
    "NotRequired",
    "Protocol",
    "Step",
    "StepOptions",
    "StepQueuedFlow",
    "TypeAlias",
    "TypeVar",
    "TypedDict",
    "annotations",
    "run_main",
    "start_worker",
    "with_step_queues",
)


# Names a worker entry file binds after importing the handler modules: a handler package of the
# same name would be shadowed, so its module is imported under an alias instead.
ENTRY_FILE_NAMES = frozenset(
    {
        "FLOW",
        "STEP_QUEUED_FLOW",
        "Handlers",
        "HANDLER",
        "HANDLERS",
        "annotations",
        "main",
        "run_main",
        "start_worker",
        "sys",
    }
)


def handler_imports(modules: Sequence[str], taken: Iterable[str]) -> dict[str, str]:
    """How a worker entry file refers to each handler module: by its dotted path, or by an alias
    (`_handlers_0`) when its top-level package has a name the file binds (`taken`).

    >>> handler_imports(["app.handlers", "start_worker.jobs"], {"start_worker"})
    {'app.handlers': 'app.handlers', 'start_worker.jobs': '_handlers_1'}
    """
    clashing = set(taken) | ENTRY_FILE_NAMES
    return {
        module: f"_handlers_{index}" if module.split(".")[0] in clashing else module
        for index, module in enumerate(sorted(set(modules)))
    }


#: A sort key of `natural`: text, and runs of digits as (leading zero?, value).
NaturalKey = list[str | tuple[int, int | str]]


def import_order(module: str) -> NaturalKey:
    """The order isort and ruff give `import` statements: ignoring case, numbers by value.

    >>> sorted(["STEP_QUEUED_FLOW", "handlers", "app.v10", "app.v2"], key=import_order)
    ['app.v2', 'app.v10', 'handlers', 'STEP_QUEUED_FLOW']
    """
    return natural(module.lower())


def snake_case(slug: str) -> str:
    """`communityThreadsV1` -> `community_threads_v1`; a Python keyword gets a trailing `_`.

    >>> snake_case("communityThreadsV1"), snake_case("HTTPServer"), snake_case("import")
    ('community_threads_v1', 'http_server', 'import_')
    """
    name = _WORD_BOUNDARY.sub("_", slug).lower()
    return f"{name}_" if keyword.iskeyword(name) else name


def pascal_case(slug: str) -> str:
    """`deliverSlack` -> `DeliverSlack`, `list_helpers` -> `ListHelpers`.

    >>> pascal_case("deliverSlack"), pascal_case("list_helpers"), pascal_case("v2")
    ('DeliverSlack', 'ListHelpers', 'V2')
    """
    return "".join(part[:1].upper() + part[1:] for part in slug.split("_") if part)


def is_identifier(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name)


def is_class_key(key: str) -> bool:
    """Whether `key` can be a field of a class-syntax TypedDict and keep its spelling: Python
    mangles `__private` names and NFKC-normalizes identifiers (a black-letter H becomes `H`),
    and ruff flags `l`, `I` and `O` (E741). Other keys take the functional form.

    >>> is_class_key("name"), is_class_key("from"), is_class_key("__x"), is_class_key("l")
    (True, False, False, False)
    """
    return (
        is_identifier(key)
        and not key.startswith("__")
        and unicodedata.normalize("NFKC", key) == key
        and key not in ("l", "I", "O")
    )


def natural(text: str) -> NaturalKey:
    """A sort key with numbers compared by value (`a2` before `a10`), as ruff sorts (the
    `natord` order): a run of digits with a leading zero compares digit by digit from the left
    (`a010` before `a02`), and before any run without one.

    >>> sorted(["a10", "a2", "a02", "a010", "a0"], key=natural)
    ['a0', 'a010', 'a02', 'a2', 'a10']
    """
    parts = re.split(r"(\d+)", text)
    return [
        ((0, part) if part.startswith("0") else (1, int(part))) if index % 2 else part
        for index, part in enumerate(parts)
    ]


def flow_module(flow_slug: str) -> str:
    """The flow's module in the output package; `workers` and `migrations` are folders there.

    >>> flow_module("communityThreadsV1"), flow_module("workers")
    ('community_threads_v1', 'workers_')
    """
    name = snake_case(flow_slug)
    return f"{name}_" if name in RESERVED_MODULES else name


def nested_part(key: str) -> str:
    """A property key or `$defs` key as part of a nested type name: `home-address` -> `HomeAddress`.

    >>> nested_part("home-address"), nested_part("2nd"), nested_part("")
    ('HomeAddress', '2nd', '')
    """
    return pascal_case("".join(c if c.isalnum() and c.isascii() else "_" for c in key))


@dataclass(frozen=True)
class StepNames:
    """The contract names of one step. `deps` exists for dependent single steps; `item` and
    `item_output` for map steps. A signal step has no handler, and its output is its payload
    (`<Step>Payload`). A subflow step has no handler either: its output (a map's `item_output`)
    is the child flow's `Output`."""

    slug: str
    index: int
    module: str
    output: str
    handler: str | None
    deps: str | None
    item: str | None
    item_output: str | None

    def types(self) -> tuple[str, ...]:
        found = (self.output, self.handler, self.deps, self.item, self.item_output)
        return tuple(name for name in found if name is not None)

    def longest(self) -> str:
        return max((*self.types(), self.module), key=len)


def step_names(
    slug: str,
    index: int,
    *,
    is_map: bool,
    has_dependencies: bool,
    is_signal: bool = False,
    is_subflow: bool = False,
) -> StepNames:
    prefix = pascal_case(slug)
    handled = not (is_signal or is_subflow)
    return StepNames(
        slug=slug,
        index=index,
        module=snake_case(slug),
        output=f"{prefix}Payload" if is_signal else f"{prefix}Output",
        handler=f"{prefix}Handler" if handled else None,
        deps=f"{prefix}Deps" if has_dependencies and not is_map and handled else None,
        item=f"{prefix}Item" if is_map and handled else None,
        item_output=f"{prefix}ItemOutput" if is_map else None,
    )


@dataclass(frozen=True)
class Collision:
    """Two steps (by index) that derive the same name (`kind`: a type or a worker module)."""

    name: str
    kind: str
    first: int
    second: int


def collisions(steps: Sequence[StepNames], *, step_modules: bool) -> list[Collision]:
    """The first shared name of every pair of steps that share one, in step order."""
    owners: dict[tuple[str, str], int] = {}
    found: dict[tuple[int, int], Collision] = {}
    for step in steps:
        derived = [(name, "type") for name in step.types()]
        if step_modules:
            derived.append((step.module, "worker module"))
        for name, kind in derived:
            first = owners.setdefault((name, kind), step.index)
            if first != step.index and (first, step.index) not in found:
                found[(first, step.index)] = Collision(name, kind, first, step.index)
    return sorted(found.values(), key=lambda c: (c.second, c.first))


class NameAllocator:
    """Hands out unique module-level names: contract names as they are, nested names with a
    number appended when taken (`InputAddress2`)."""

    def __init__(self, reserved: Iterable[str]) -> None:
        self._reserved = set(reserved) | set(FIXED_NAMES)
        self._taken: set[str] = set()

    def contract(self, name: str) -> str:
        if name in self._taken:
            raise ValueError(f"contract name {name} is generated twice")
        self._taken.add(name)
        return name

    def nested(self, wanted: str) -> str:
        wanted = wanted[: MAX_NAME_LENGTH - 4]  # room for a number
        name, number = wanted, 1
        while name in self._taken or name in self._reserved:
            number += 1
            name = f"{wanted}{number}"
        self._taken.add(name)
        return name

"""How big a spec may grow: its nesting depth and its size with every YAML alias expanded.

Both are measured on the parser's event stream, before any value is built, so a spec that abuses
aliases (nine levels of nine aliases expand to 9^9 values from twelve lines) or nests thousands of
levels deep is refused in milliseconds with its location, instead of filling the memory or
overflowing a recursive walk later. The walk keeps its own stack: it never recurses. Every later
step (models, checks, code generation) may recurse, as nothing deeper than MAX_DEPTH reaches it.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError
from ruamel.yaml.events import (
    AliasEvent,
    CollectionEndEvent,
    CollectionStartEvent,
    MappingStartEvent,
    NodeEvent,
)

from pgflow_gen.spec.problems import Location, Problem

MAX_DEPTH = 64
"""Mappings and lists nested in one another, counted from the top of the file."""

MAX_VALUES = 200_000
"""Values (mappings, lists and scalars) in a file, each alias counted as the values it repeats."""


@dataclass
class _Collection:
    """An open mapping or list: its anchor, its finished children and where its next child goes."""

    mapping: bool
    anchor: str | None
    path: list[str | int]
    height: int = 1
    children: int = 0
    key: str | None = None  # the last scalar key of a mapping, for the path of its value

    def next_path(self) -> list[str | int]:
        """The YAML path of the child that comes next (a key's path is its mapping's)."""
        if not self.mapping:
            return [*self.path, self.children]
        if self.children % 2 == 1 and self.key is not None:
            return [*self.path, self.key]
        return self.path


@dataclass
class _Walk:
    """The event walk: open collections, finished anchors and the values counted so far."""

    file: str
    stack: list[_Collection] = field(default_factory=list)
    anchors: dict[str, tuple[int, int]] = field(default_factory=dict)  # -> (values, height)
    values: int = 0
    sizes: list[int] = field(default_factory=list)  # values counted when each open one started

    def path(self) -> list[str | int]:
        return self.stack[-1].next_path() if self.stack else []

    def step(self, event: object) -> Problem | None:
        """Account for one parser event; the problem it makes, if any."""
        if isinstance(event, CollectionStartEvent):
            if len(self.stack) >= MAX_DEPTH:
                return _too_deep(self.file, event, self.path())
            self.stack.append(
                _Collection(isinstance(event, MappingStartEvent), event.anchor, self.path())
            )
            self.sizes.append(self.values)
            return self._count(1, event)
        if isinstance(event, CollectionEndEvent):
            done = self.stack.pop()
            started_at = self.sizes.pop()
            if done.anchor is not None:
                self.anchors[done.anchor] = (self.values - started_at, done.height)
            self._finish_child(done.height, None)
            return None
        if isinstance(event, AliasEvent):
            if any(open_.anchor == event.anchor for open_ in self.stack):
                return _recursive_alias(self.file, event, self.path())
            values, height = self.anchors.get(event.anchor, (1, 0))
            if len(self.stack) + height > MAX_DEPTH:
                return _too_deep(self.file, event, self.path())
            problem = self._count(values, event)
            self._finish_child(height, None)
            return problem
        if isinstance(event, NodeEvent):  # a scalar
            if event.anchor is not None:
                self.anchors[event.anchor] = (1, 0)
            problem = self._count(1, event)
            self._finish_child(0, getattr(event, "value", None))
            return problem
        return None

    def _finish_child(self, height: int, scalar: object) -> None:
        if not self.stack:
            return
        parent = self.stack[-1]
        if parent.mapping and parent.children % 2 == 0:
            parent.key = scalar if isinstance(scalar, str) else None
        parent.children += 1
        parent.height = max(parent.height, height + 1)

    def _count(self, values: int, event: object) -> Problem | None:
        self.values += values
        if self.values > MAX_VALUES:
            return _too_large(self.file, event, self.path())
        return None


def check(text: str, file: str) -> list[Problem]:
    """The limit a spec's text breaks, as one located problem, or none.

    Syntax errors are left to the loader, which reports them with their own location.
    """
    walk = _Walk(file)
    try:
        for event in YAML(typ="safe", pure=False).parse(io.StringIO(text)):
            problem = walk.step(event)
            if problem is not None:
                return [problem]
    except YAMLError:  # a syntax error: the loader reports it with its location
        return []
    return []


def _location(file: str, event: object, path: list[str | int]) -> Location:
    mark = getattr(event, "start_mark", None)
    rendered = ""
    for key in path:
        rendered = (
            f"{rendered}[{key}]"
            if isinstance(key, int)
            else (f"{rendered}.{key}" if rendered else key)
        )
    return Location(
        file,
        None if mark is None else mark.line + 1,
        None if mark is None else mark.column + 1,
        rendered,
    )


def _too_deep(file: str, event: object, path: list[str | int]) -> Problem:
    return Problem(
        "spec_too_deep",
        f"The spec nests deeper than {MAX_DEPTH} levels.",
        _location(file, event, path),
        hint='Give a deep schema a name in "$defs" and refer to it with "$ref".',
    )


def _too_large(file: str, event: object, path: list[str | int]) -> Problem:
    return Problem(
        "spec_too_large",
        f"The spec expands to more than {MAX_VALUES:,} values.",
        _location(file, event, path),
        detail="YAML aliases count as every value they repeat.",
        hint="Repeat less through aliases, or split the flow.",
    )


def _recursive_alias(file: str, event: object, path: list[str | int]) -> Problem:
    return Problem(
        "recursive_alias",
        f'The alias "*{getattr(event, "anchor", "")}" repeats a value that contains it.',
        _location(file, event, path),
        hint="A spec is a tree: an alias may repeat a finished value, never its own container.",
    )

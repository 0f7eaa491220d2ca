"""A flow's DAG laid out for an SVG drawn on the server: steps in columns by depth (a root is in
column 0, a step one column right of its deepest dependency), in step order within a column,
columns centred on the tallest, and one curve per dependency from the right edge of the
dependency to the left edge of the step. No browser script and no external binary is involved;
the template prints what this computes.

>>> graph = layout([
...     Box("fetch", (), "completed", "completed"),
...     Box("parse", ("fetch",), "failed", "failed, 3 attempts"),
... ])
>>> [(node.slug, node.x, node.y) for node in graph.nodes]
[('fetch', 16, 16), ('parse', 232, 16)]
>>> graph.width, graph.height
(424, 76)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

NODE_WIDTH = 176
NODE_HEIGHT = 44
GAP_X = 40
GAP_Y = 20
MARGIN = 16
MAX_LABEL = 22  # characters of a slug that fit a box; the whole slug is in its tooltip


@dataclass(frozen=True)
class Box:
    """One step as the drawing needs it: slug, dependency slugs, the state that colours it (a
    CSS class suffix) and the caption under the slug."""

    slug: str
    dependencies: tuple[str, ...]
    state: str
    caption: str


@dataclass(frozen=True)
class Node:
    slug: str
    label: str
    state: str
    caption: str
    x: int
    y: int
    width: int = NODE_WIDTH
    height: int = NODE_HEIGHT


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    path: str  # an SVG path's `d`


@dataclass(frozen=True)
class Graph:
    width: int
    height: int
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]


def layout(boxes: Sequence[Box]) -> Graph:
    """Place the steps (given in step order, so every dependency comes first)."""
    depth: dict[str, int] = {}
    for box in boxes:
        depth[box.slug] = 1 + max((depth[d] for d in box.dependencies if d in depth), default=-1)
    columns: dict[int, list[Box]] = {}
    for box in boxes:
        columns.setdefault(depth[box.slug], []).append(box)
    tallest = max((len(column) for column in columns.values()), default=0)
    nodes: dict[str, Node] = {}
    for column, members in sorted(columns.items()):
        offset = (tallest - len(members)) * (NODE_HEIGHT + GAP_Y) // 2
        for row, box in enumerate(members):
            label = box.slug if len(box.slug) <= MAX_LABEL else box.slug[: MAX_LABEL - 1] + "…"
            nodes[box.slug] = Node(
                slug=box.slug,
                label=label,
                state=box.state,
                caption=box.caption,
                x=MARGIN + column * (NODE_WIDTH + GAP_X),
                y=MARGIN + offset + row * (NODE_HEIGHT + GAP_Y),
            )
    edges = tuple(
        _edge(nodes[dependency], nodes[box.slug])
        for box in boxes
        for dependency in box.dependencies
        if dependency in nodes
    )
    width = 2 * MARGIN + len(columns) * NODE_WIDTH + max(len(columns) - 1, 0) * GAP_X
    height = 2 * MARGIN + tallest * NODE_HEIGHT + max(tallest - 1, 0) * GAP_Y
    return Graph(width=width, height=height, nodes=tuple(nodes.values()), edges=edges)


def _edge(source: Node, target: Node) -> Edge:
    x1, y1 = source.x + source.width, source.y + source.height // 2
    x2, y2 = target.x, target.y + target.height // 2
    middle = (x1 + x2) // 2
    return Edge(source.slug, target.slug, f"M{x1},{y1} C{middle},{y1} {middle},{y2} {x2},{y2}")

"""A flow's DAG laid out as a layered graph for an SVG drawn on the server (no browser script and
no external binary; the template prints what this computes).

- **Columns.** A root is in column 0 and a step one column right of its deepest dependency.
- **Slots for long edges.** An edge that spans more than one column passes every column between
  through a slot of its own (a dummy node, as Sugiyama-style layouts do), so it never runs through
  a box: it crosses a column only in its slot and travels between columns in the gap, where no
  box is (the curve's control points lie in the gap, so the curve does too).
- **Order.** Within a column, barycentre sweeps (each item towards the mean place of its
  neighbours in the column before, then after) reduce crossings; the order with the fewest wins.
- **Height.** Each item is pulled towards its neighbours' mean height, keeping the order and the
  gaps (an isotonic fit per column), a few sweeps each way.

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
from itertools import accumulate, pairwise

NODE_WIDTH = 176
NODE_HEIGHT = 44
CONDITION_HEIGHT = 14  # a box with a condition has a third line
SLOT_HEIGHT = 8  # a long edge's place in a column it passes
GAP_X = 40
GAP_Y = 20
SLOT_GAP = 6  # between two slots
MARGIN = 16
MAX_LABEL = 22  # characters of a slug that fit a box; the whole slug is in its tooltip
MAX_CONDITION = 24  # characters of a condition that fit a box; the whole one is in its tooltip
SWEEPS = 8


@dataclass(frozen=True)
class Box:
    """One step as the drawing needs it: slug, dependency slugs, the state that colours it (a
    CSS class suffix), the caption under the slug and the step's condition in words, if any."""

    slug: str
    dependencies: tuple[str, ...]
    state: str
    caption: str
    condition: str | None = None
    #: What runs its tasks: "task" (a handler), "signal" or "subflow" (runs of another flow).
    kind: str = "task"


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
    condition: str | None = None
    condition_label: str | None = None
    kind: str = "task"


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
    """Place the steps (given in step order, so every dependency comes first); a dependency that
    is not among the boxes is left out."""
    column_of: dict[str, int] = {}
    for box in boxes:
        column_of[box.slug] = 1 + max(
            (column_of[d] for d in box.dependencies if d in column_of), default=-1
        )
    columns: list[list[str]] = [[] for _ in range(1 + max(column_of.values(), default=-1))]
    height: dict[str, int] = {}
    for box in boxes:
        columns[column_of[box.slug]].append(box.slug)
        height[box.slug] = NODE_HEIGHT + (CONDITION_HEIGHT if box.condition else 0)
    chains: list[list[str]] = []  # per edge: source, its slots, target
    for box in boxes:
        for dependency in box.dependencies:
            if dependency not in column_of:
                continue
            slots = []
            for column in range(column_of[dependency] + 1, column_of[box.slug]):
                slot = f"{dependency}\0{box.slug}\0{column}"
                columns[column].append(slot)
                height[slot] = SLOT_HEIGHT
                slots.append(slot)
            chains.append([dependency, *slots, box.slug])
    before: dict[str, list[str]] = {}
    after: dict[str, list[str]] = {}
    for chain in chains:
        for source, target in pairwise(chain):
            after.setdefault(source, []).append(target)
            before.setdefault(target, []).append(source)

    columns = _order(columns, before, after)
    centre = _place(columns, height, before, after)
    top = min((centre[key] - height[key] / 2 for key in centre), default=0.0)
    y = {key: round(centre[key] - height[key] / 2 - top) + MARGIN for key in centre}
    x = {key: MARGIN + index * (NODE_WIDTH + GAP_X)
         for index, column in enumerate(columns) for key in column}  # fmt: skip
    nodes = tuple(
        Node(
            slug=box.slug,
            label=_cut(box.slug, MAX_LABEL),
            state=box.state,
            caption=box.caption,
            x=x[box.slug],
            y=y[box.slug],
            height=height[box.slug],
            condition=box.condition,
            condition_label=_cut(box.condition, MAX_CONDITION) if box.condition else None,
            kind=box.kind,
        )
        for box in boxes
    )
    edges = tuple(Edge(chain[0], chain[-1], _path(chain, x, y, height)) for chain in chains)
    bottom = max((y[key] + height[key] for key in y), default=MARGIN)
    width = 2 * MARGIN + len(columns) * NODE_WIDTH + max(len(columns) - 1, 0) * GAP_X
    return Graph(width=width, height=bottom + MARGIN, nodes=nodes, edges=edges)


def _order(
    columns: list[list[str]], before: dict[str, list[str]], after: dict[str, list[str]]
) -> list[list[str]]:
    """The order within each column with the fewest crossings that the sweeps found."""
    best = [list(column) for column in columns]
    fewest = _crossings(best, after)
    current = [list(column) for column in columns]
    for sweep in range(SWEEPS):
        downwards = sweep % 2 == 0
        indexes = range(1, len(current)) if downwards else range(len(current) - 2, -1, -1)
        for index in indexes:
            neighbours = before if downwards else after
            fixed = current[index - 1] if downwards else current[index + 1]
            place = {key: position for position, key in enumerate(fixed)}
            current[index] = _by_barycentre(current[index], neighbours, place)
        crossings = _crossings(current, after)
        if crossings < fewest:
            best, fewest = [list(column) for column in current], crossings
    return best


def _by_barycentre(
    column: list[str], neighbours: dict[str, list[str]], place: dict[str, int]
) -> list[str]:
    def key(item: tuple[int, str]) -> float:
        position, slug = item
        known = [place[n] for n in neighbours.get(slug, ()) if n in place]
        # Scaled to the fixed column's places; an item without neighbours there keeps its own.
        return sum(known) / len(known) if known else position * max(len(place), 1) / len(column)

    return [slug for _, slug in sorted(enumerate(column), key=key)]


def _crossings(columns: list[list[str]], after: dict[str, list[str]]) -> int:
    count = 0
    for left, right in pairwise(columns):
        place = {key: position for position, key in enumerate(right)}
        pairs = [
            (position, place[target])
            for position, source in enumerate(left)
            for target in after.get(source, ())
        ]
        count += sum(
            1
            for i, (a, b) in enumerate(pairs)
            for (c, d) in pairs[i + 1 :]
            if (a - c) * (b - d) < 0
        )
    return count


def _place(
    columns: list[list[str]],
    height: dict[str, int],
    before: dict[str, list[str]],
    after: dict[str, list[str]],
) -> dict[str, float]:
    """Each item's vertical centre: stacked first, then pulled towards its neighbours."""
    centre: dict[str, float] = {}
    for column in columns:
        for key, offset in zip(column, accumulate([0, *_separations(column, height)]), strict=True):
            centre[key] = height[column[0]] / 2 + offset
    for sweep in range(SWEEPS):
        downwards = sweep % 2 == 0
        neighbours = before if downwards else after
        for column in columns if downwards else reversed(columns):
            wanted = [
                sum(centre[n] for n in neighbours[key]) / len(neighbours[key])
                if neighbours.get(key)
                else centre[key]
                for key in column
            ]
            for key, value in zip(column, _fit(wanted, _separations(column, height)), strict=True):
                centre[key] = value
    return centre


def _separations(column: list[str], height: dict[str, int]) -> list[float]:
    """The least distance between the centres of each two neighbours in a column."""
    return [
        (height[a] + height[b]) / 2 + (SLOT_GAP if _is_slot(a) and _is_slot(b) else GAP_Y)
        for a, b in pairwise(column)
    ]


def _fit(wanted: list[float], separations: list[float]) -> list[float]:
    """The places nearest (least squares) to `wanted` that keep the order and the separations:
    with each place less its share of the separations, an isotonic regression (pool adjacent
    violators)."""
    offsets = list(accumulate([0.0, *separations]))
    blocks: list[tuple[float, int]] = []  # (sum, count) of pooled targets
    for target in (w - o for w, o in zip(wanted, offsets, strict=True)):
        total, count = target, 1
        while blocks and blocks[-1][0] / blocks[-1][1] > total / count:
            pooled, pooled_count = blocks.pop()
            total, count = total + pooled, count + pooled_count
        blocks.append((total, count))
    fitted = [total / count for total, count in blocks for _ in range(count)]
    return [value + offset for value, offset in zip(fitted, offsets, strict=True)]


def _path(chain: list[str], x: dict[str, int], y: dict[str, int], height: dict[str, int]) -> str:
    """From the source's right edge through each slot to the target's left edge: a curve in
    each gap, a straight line across each column passed."""
    middle = [y[key] + height[key] // 2 for key in chain]
    x1, y1 = x[chain[0]] + NODE_WIDTH, middle[0]
    parts = [f"M{x1},{y1}"]
    for key, level in zip(chain[1:], middle[1:], strict=True):
        x2 = x[key]
        half = (x1 + x2) // 2
        parts.append(f"C{half},{y1} {half},{level} {x2},{level}")
        x1, y1 = x2, level
        if key != chain[-1]:  # a slot: straight across its column
            x1 = x2 + NODE_WIDTH
            parts.append(f"L{x1},{y1}")
    return " ".join(parts)


def _is_slot(key: str) -> bool:
    return "\0" in key


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"

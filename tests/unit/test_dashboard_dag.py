"""The run page's DAG drawing: no edge runs through a box that is not one of its two ends, for
every example flow and for random DAGs of up to 30 steps; boxes never overlap; every edge leaves
its source's right edge and enters its target's left edge."""

from __future__ import annotations

import re
from itertools import pairwise
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from pgflow_gen.dashboard import dag
from pgflow_gen.spec import loader

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_SPECS = sorted(ROOT.glob("examples/*/flows/*.yaml"))
Point = tuple[float, float]


def test_there_are_example_flows_to_check() -> None:
    assert len(EXAMPLE_SPECS) >= 4


def test_every_example_flow_draws_without_an_edge_through_a_box() -> None:
    for path in EXAMPLE_SPECS:
        spec = loader.load_file(path)
        boxes = [
            dag.Box(
                step.slug,
                (step.array,) if step.type == "map" and step.array else tuple(step.depends_on),
                "created",
                "created",
                "if: ..." if step.if_ is not None else None,
            )
            for step in spec.steps
        ]
        assert_drawn_cleanly(dag.layout(boxes), boxes)


@st.composite
def dags(draw: st.DrawFn) -> list[dag.Box]:
    count = draw(st.integers(min_value=1, max_value=30))
    boxes: list[dag.Box] = []
    for index in range(count):
        earlier = [box.slug for box in boxes]
        dependencies = (
            draw(st.lists(st.sampled_from(earlier), unique=True, max_size=min(len(earlier), 5)))
            if earlier
            else []
        )
        condition = "if: {}" if draw(st.booleans()) else None
        boxes.append(dag.Box(f"step{index}", tuple(dependencies), "created", "", condition))
    return boxes


@settings(max_examples=200, deadline=None)
@given(dags())
def test_random_dags_draw_without_an_edge_through_a_box(boxes: list[dag.Box]) -> None:
    assert_drawn_cleanly(dag.layout(boxes), boxes)


def test_a_long_edge_goes_around_the_box_between() -> None:
    """The issue's case: validate -> charge drew straight through reserveStock."""
    boxes = [
        dag.Box("validate", (), "completed", ""),
        dag.Box("reserve", ("validate",), "completed", ""),
        dag.Box("charge", ("validate", "reserve"), "started", ""),
    ]
    graph = dag.layout(boxes)
    assert_drawn_cleanly(graph, boxes)
    [long_edge] = [e for e in graph.edges if (e.source, e.target) == ("validate", "charge")]
    assert " L" in long_edge.path  # it passes the middle column in a slot of its own


def test_a_condition_gives_its_box_a_third_line_cut_to_fit() -> None:
    condition = 'if {"order":{"total":{"over":1000}}} else skip'
    graph = dag.layout([dag.Box("ship", (), "created", "", condition)])
    [node] = graph.nodes
    assert node.height == dag.NODE_HEIGHT + dag.CONDITION_HEIGHT
    assert node.condition == condition
    assert node.condition_label is not None
    assert len(node.condition_label) == dag.MAX_CONDITION
    assert node.condition_label.endswith("…")


def assert_drawn_cleanly(graph: dag.Graph, boxes: list[dag.Box]) -> None:
    nodes = {node.slug: node for node in graph.nodes}
    assert list(nodes) == [box.slug for box in boxes]
    for node in graph.nodes:
        assert node.x >= 0
        assert node.x + node.width <= graph.width
        assert node.y >= 0
        assert node.y + node.height <= graph.height
    placed = list(graph.nodes)
    for i, a in enumerate(placed):
        for b in placed[i + 1 :]:
            assert not _overlap(_rect(a), _rect(b)), (a.slug, b.slug)
    wanted = sorted((d, box.slug) for box in boxes for d in box.dependencies)
    assert sorted((edge.source, edge.target) for edge in graph.edges) == wanted
    for edge in graph.edges:
        points = _polyline(edge.path)
        source, target = nodes[edge.source], nodes[edge.target]
        assert points[0] == (source.x + source.width, source.y + source.height // 2)
        assert points[-1] == (target.x, target.y + target.height // 2)
        for node in graph.nodes:
            if node.slug in (edge.source, edge.target):
                continue
            for start, end in pairwise(points):
                assert not _segment_meets_rect(start, end, _rect(node)), (
                    f"{edge.source} -> {edge.target} runs through {node.slug}"
                )


def _rect(node: dag.Node) -> tuple[float, float, float, float]:
    return (node.x, node.y, node.x + node.width, node.y + node.height)


def _overlap(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _polyline(path: str) -> list[Point]:
    """The path as points: each cubic curve flattened into 64 pieces."""
    tokens = re.findall(r"[MCL]|-?\d+(?:\.\d+)?", path)
    points: list[Point] = []
    index = 0
    while index < len(tokens):
        command = tokens[index]
        numbers = [float(t) for t in tokens[index + 1 : index + 1 + (6 if command == "C" else 2)]]
        index += 1 + len(numbers)
        if command in "ML":
            points.append((numbers[0], numbers[1]))
            continue
        (x0, y0), (x1, y1, x2, y2, x3, y3) = points[-1], numbers
        for step in range(1, 65):
            t = step / 64
            u = 1 - t
            points.append(
                (
                    u**3 * x0 + 3 * u * u * t * x1 + 3 * u * t * t * x2 + t**3 * x3,
                    u**3 * y0 + 3 * u * u * t * y1 + 3 * u * t * t * y2 + t**3 * y3,
                )
            )
    return points


def _segment_meets_rect(start: Point, end: Point, rect: tuple[float, float, float, float]) -> bool:
    """Whether the segment touches the closed rectangle (Liang-Barsky clipping)."""
    (x0, y0), (x1, y1) = start, end
    left, top, right, bottom = rect
    dx, dy = x1 - x0, y1 - y0
    low, high = 0.0, 1.0
    for p, q in ((-dx, x0 - left), (dx, right - x0), (-dy, y0 - top), (dy, bottom - y0)):
        if p == 0:
            if q < 0:
                return False
        else:
            r = q / p
            if p < 0:
                low = max(low, r)
            else:
                high = min(high, r)
            if low > high:
                return False
    return True

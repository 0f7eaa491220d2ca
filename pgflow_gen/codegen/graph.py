"""`pgflow-gen graph`: a flow's DAG as Mermaid or Graphviz DOT, with conditions and queues, or
its metadata as JSON (`metadata`)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pgflow_gen import naming
from pgflow_gen.spec import model

GraphFormat = Literal["mermaid", "dot"]


def render(spec: model.FlowSpec, graph_format: GraphFormat) -> str:
    routes = naming.resolve_queue_routes(spec.slug, [s.slug for s in spec.steps], spec.queue_mode)
    nodes = []
    for step, route in zip(spec.steps, routes, strict=True):
        if step.signal is None:
            lines = [f"{step.slug} ({step.type})", f"queue: {route.queue_name}"]
        else:  # no queue, no worker: it waits
            timeout = step.signal.timeout
            until = f"at most {timeout} s" if timeout is not None else "for ever"
            lines = [f"{step.slug} (signal)", f"waits for a signal, {until}"]
        if step.if_ is not None:
            lines.append(f"if: {_compact(step.if_)}")
        if step.if_not is not None:
            lines.append(f"if_not: {_compact(step.if_not)}")
        if step.if_ is not None or step.if_not is not None:
            lines.append(f"when_unmet: {step.when_unmet or 'skip'}")
        if step.when_exhausted != "fail":
            lines.append(f"when_exhausted: {step.when_exhausted}")
        dependencies = [step.array] if step.type == "map" and step.array else step.depends_on
        nodes.append((step.slug, lines, list(dependencies)))
    return _mermaid(spec, nodes) if graph_format == "mermaid" else _dot(spec, nodes)


def metadata(spec: model.FlowSpec) -> dict[str, Any]:
    """The flow's DAG for scripts: each step with its type, queue, edges and conditions
    (`edges_from`: the steps it waits for; a map step waits for the one it maps)."""
    routes = naming.resolve_queue_routes(spec.slug, [s.slug for s in spec.steps], spec.queue_mode)
    return {
        "flow_slug": spec.slug,
        "queue_mode": spec.queue_mode,
        "steps": [
            {
                "slug": step.slug,
                "type": step.step_type,
                "queue_name": route.queue_name if step.signal is None else None,
                "depends_on": list(step.depends_on),
                "array": step.array,
                "edges_from": [step.array]
                if step.type == "map" and step.array
                else list(step.depends_on),
                "if": step.if_,
                "if_not": step.if_not,
                "when_unmet": step.when_unmet or "skip",
                "when_exhausted": step.when_exhausted,
                "handler": step.handler,
                "signal": None
                if step.signal is None
                else {
                    "timeout": step.signal.timeout,
                    "payload": None
                    if step.signal.payload is None
                    else step.signal.payload.as_json(),
                },
            }
            for step, route in zip(spec.steps, routes, strict=True)
        ],
    }


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _mermaid(spec: model.FlowSpec, nodes: list[tuple[str, list[str], list[str]]]) -> str:
    out = [f"%% flow {spec.slug} (queue mode: {spec.queue_mode})", "flowchart TD"]
    for slug, lines, _ in nodes:
        label = "<br/>".join(line.replace('"', "#quot;") for line in lines)
        out.append(f'  {slug}["{label}"]')
    for slug, _, dependencies in nodes:
        out.extend(f"  {dep} --> {slug}" for dep in dependencies)
    return "\n".join(out) + "\n"


def _dot(spec: model.FlowSpec, nodes: list[tuple[str, list[str], list[str]]]) -> str:
    out = [f'digraph "{spec.slug}" {{', "  rankdir=TB;", "  node [shape=box];"]
    for slug, lines, _ in nodes:
        label = "\\n".join(line.replace("\\", "\\\\").replace('"', '\\"') for line in lines)
        out.append(f'  "{slug}" [label="{label}"];')
    for slug, _, dependencies in nodes:
        out.extend(f'  "{dep}" -> "{slug}";' for dep in dependencies)
    out.append("}")
    return "\n".join(out) + "\n"

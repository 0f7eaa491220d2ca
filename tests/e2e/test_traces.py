"""OpenTelemetry traces across processes: a caller starts a run inside a span, step workers in
processes of their own (started from the generated entry files) run its tasks, and every task's
span is a child of the caller's span, in the caller's trace, with the task's attributes. Each
process records its spans with the SDK's in-memory exporter, set up as an application (or
`opentelemetry-instrument`) would set it up before the worker runs: here by a `sitecustomize`
module that writes the finished spans to a file when the process exits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import PROJECT, Db, Workers, eventually

SITECUSTOMIZE = textwrap.dedent(
    """
    import atexit, json, os

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


    def dump():
        spans = [
            {
                "name": span.name,
                "trace_id": format(span.context.trace_id, "032x"),
                "span_id": format(span.context.span_id, "016x"),
                "parent_id": format(span.parent.span_id, "016x") if span.parent else None,
                "kind": span.kind.name,
                "status": span.status.status_code.name,
                "attributes": dict(span.attributes or {}),
            }
            for span in exporter.get_finished_spans()
        ]
        with open(os.environ["PGFLOW_TEST_SPANS"], "w") as out:
            json.dump(spans, out)


    atexit.register(dump)
    """
)

CALLER = textwrap.dedent(
    """
    import json, sys

    from opentelemetry import trace

    from app.pgflow import e2e_steps
    from pgflow_gen.runtime import Client

    with trace.get_tracer("checkout").start_as_current_span("checkout") as span:
        with Client(sys.argv[1]) as client:
            runs = [client.start_flow(e2e_steps.FLOW, {"n": n}) for n in (1, 2)]
    print(json.dumps({"runs": [str(run.run_id) for run in runs]}))
    """
)


@pytest.fixture
def traced(tmp_path: Path) -> Path:
    """A folder whose sitecustomize sets up tracing in every Python process started with it."""
    folder = tmp_path / "traced"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return folder


def spans_of(path: Path) -> list[dict[str, Any]]:
    spans: list[dict[str, Any]] = json.loads(path.read_text())
    return spans


def environment(traced: Path, spans: Path) -> dict[str, str]:
    return {
        "PYTHONPATH": os.pathsep.join([str(traced), str(PROJECT)]),
        "PGFLOW_TEST_SPANS": str(spans),
    }


def test_every_task_of_a_run_is_a_child_of_the_callers_span_across_processes(
    workers: Workers, db: Db, db_url: str, traced: Path, tmp_path: Path
) -> None:
    steps = ("first", "second", "side")
    processes = {
        step: workers.start(
            "e2e_steps", step, **environment(traced, tmp_path / f"{step}.json")
        ).started()
        for step in steps
    }
    caller_spans = tmp_path / "caller.json"
    started = subprocess.run(
        [sys.executable, "-c", CALLER, db_url],
        cwd=PROJECT, env={**os.environ, **environment(traced, caller_spans)},
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    runs = [uuid.UUID(run) for run in json.loads(started.stdout)["runs"]]
    for run_id in runs:
        assert db.finished(run_id)["status"] == "completed"
    for process in processes.values():
        assert process.stop() == 0

    [checkout] = spans_of(caller_spans)
    assert checkout["name"] == "checkout"
    stored = {
        row[0]: row[1] for row in db.conn.execute("select run_id, traceparent from pgflow.runs")
    }
    assert {value[:-3] for value in stored.values()} == {
        f"00-{checkout['trace_id']}-{checkout['span_id']}"
    }  # and its trace flags

    tasks = [span for step in steps for span in spans_of(tmp_path / f"{step}.json")]
    assert len(tasks) == len(runs) * len(steps)
    for span in tasks:
        assert span["trace_id"] == checkout["trace_id"]  # one trace: the caller's
        assert span["parent_id"] == checkout["span_id"]
        assert span["kind"] == "CONSUMER"
        assert span["status"] == "UNSET"
        attributes = span["attributes"]
        assert attributes["pgflow.flow"] == "e2eSteps"
        assert span["name"] == f"pgflow.task e2eSteps.{attributes['pgflow.step']}"
        assert uuid.UUID(attributes["pgflow.run_id"]) in runs
        assert attributes["pgflow.task_index"] == 0
        assert attributes["pgflow.attempt"] == 1
        assert attributes["pgflow.outcome"] == "completed"
        assert attributes["messaging.destination.name"] == f"e2esteps__{attributes['pgflow.step']}"
        assert uuid.UUID(attributes["pgflow.worker_id"])
    by_run = {(s["attributes"]["pgflow.run_id"], s["attributes"]["pgflow.step"]) for s in tasks}
    assert by_run == {(str(run), step) for run in runs for step in steps}


def test_a_run_started_without_a_trace_has_one_trace_named_by_its_run_id(
    workers: Workers, db: Db, traced: Path, tmp_path: Path
) -> None:
    spans = tmp_path / "first.json"
    worker = workers.start("e2e_steps", "first", **environment(traced, spans)).started()
    run_id = db.start("e2eSteps", {"n": 1, "fail_first": 1})  # from SQL: no caller's context

    def first_done() -> bool:
        return bool(db.task(run_id, "first")["status"] == "completed")

    eventually(first_done, "the first step, retried once")
    assert worker.stop() == 0

    attempts = sorted(spans_of(spans), key=lambda s: s["attributes"]["pgflow.attempt"])
    assert [s["attributes"]["pgflow.outcome"] for s in attempts] == ["failed", "completed"]
    assert {s["trace_id"] for s in attempts} == {run_id.hex}
    assert attempts[0]["status"] == "ERROR"
    assert db.run(run_id)["traceparent"] is None

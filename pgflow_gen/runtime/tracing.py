"""OpenTelemetry traces of runs (the optional `otel` extra: `opentelemetry-api`). Nothing here
does anything until the application (or `opentelemetry-instrument`) sets a tracer provider:

- `Client.start_flow` and `start_flows` store the caller's trace context with the run
  (`traceparent()`, written to the transaction's `pgflow.traceparent` setting, which the engine
  keeps in `runs.traceparent`);
- a worker makes one span per task (`task_span`): flow, step, run id, task index, attempt,
  queue, worker id and outcome, a child of the stored context, so every task of a run, in any
  worker process, joins the caller's trace. A run started without one (from SQL, say) gets a
  trace of its own, whose id is the run id: its tasks still share one trace.

Without the extra installed every function here is a no-op.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ModuleNotFoundError:  # the `otel` extra is not installed
    trace = None  # type: ignore[assignment]

from pgflow_gen.runtime.claimed_task import ClaimedTask

TRACER_NAME = "pgflow_gen"
RECHECK_S = 1.0
_SAMPLED = 0x01
#: [whether a tracer provider was set, until when (monotonic) that answer holds].
_checked: list[Any] = [False, 0.0]


def enabled() -> bool:
    """Whether an application set a tracer provider (spans would be recorded somewhere). Looked
    up at most once a second (a lookup costs more than the rest of a task's tracing checks); a
    provider set later is seen within the second."""
    if trace is None:
        return False
    now = time.monotonic()
    if now < _checked[1]:
        return bool(_checked[0])
    provider = trace.get_tracer_provider()
    found = not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
    _checked[:] = [found, now + RECHECK_S]
    return found


def traceparent() -> str | None:
    """The W3C traceparent of the caller's current span, or None (no tracing, no span)."""
    if not enabled():
        return None
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent")


def _parent(run_id: uuid.UUID, stored: str | None) -> Any:
    """The context a task's span is a child of: the stored caller's, else one derived from the
    run id (the same for every task of the run, in every process)."""
    assert trace is not None
    if stored:
        found = TraceContextTextMapPropagator().extract({"traceparent": stored})
        if trace.get_current_span(found).get_span_context().is_valid:
            return found
    span_id = (run_id.int & 0xFFFF_FFFF_FFFF_FFFF) or 1
    parent = trace.SpanContext(
        trace_id=run_id.int, span_id=span_id, is_remote=True,
        trace_flags=trace.TraceFlags(_SAMPLED),
    )  # fmt: skip
    return trace.set_span_in_context(trace.NonRecordingSpan(parent))


@contextlib.contextmanager
def task_span(task: ClaimedTask, queue_name: str, worker_id: uuid.UUID) -> Iterator[Any]:
    """The span of one task's attempt, current while its handler runs (a sync handler's thread
    sees it too), or None when nothing traces. Set its outcome with `end_task`."""
    if not enabled():
        yield None
        return
    assert trace is not None
    tracer = trace.get_tracer(TRACER_NAME)
    attributes: dict[str, str | int] = {
        "pgflow.flow": task.flow_slug,
        "pgflow.step": task.step_slug,
        "pgflow.run_id": str(task.run_id),
        "pgflow.task_index": task.task_index,
        "pgflow.attempt": task.attempt,
        "pgflow.worker_id": str(worker_id),
        "messaging.system": "pgmq",
        "messaging.destination.name": queue_name,
        "messaging.message.id": str(task.msg_id),
    }
    with tracer.start_as_current_span(
        f"pgflow.task {task.flow_slug}.{task.step_slug}",
        context=_parent(task.run_id, task.traceparent),
        kind=trace.SpanKind.CONSUMER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def end_task(span: Any, outcome: str, error: str | None) -> None:
    """Say how the task's attempt ended: completed, failed (with the error's first line) or
    stopped (its run was cancelled)."""
    if span is None or trace is None:
        return
    span.set_attribute("pgflow.outcome", outcome)
    if error is not None:
        span.set_status(trace.Status(trace.StatusCode.ERROR, error.split("\n", 1)[0][:200]))

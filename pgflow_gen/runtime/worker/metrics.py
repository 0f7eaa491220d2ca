"""A worker's Prometheus metrics: what it claimed, how its handlers ended and how long they
took, what it holds in flight, what steps' limits held back, and the trouble it met (reconnects,
messages it could not claim, results the engine ignored). They live in prometheus_client's
default registry, so a worker embedded in an application shows them beside the application's
own; with the `metrics_port` setting (`--metrics-port`, `PGFLOW_METRICS_PORT`) the worker serves
them at `/metrics` itself.

Every series carries the flow, the step (empty where a message's step is unknown) and the queue.
The engine's own gauges (queue depth, coverage, runs by status) come from SQL instead
(`pgflow-gen metrics`, the dashboard's `/metrics`; docs/observability.md).

>>> from prometheus_client import REGISTRY
>>> metrics = WorkerMetrics("greetUser", "greetuser")
>>> metrics.claimed("greeting")
>>> metrics.finished("greeting", "completed", 0.25)
>>> labels = {"flow": "greetUser", "step": "greeting", "queue": "greetuser"}
>>> REGISTRY.get_sample_value("pgflow_worker_tasks_claimed_total", labels) >= 1
True
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from pgflow_gen.runtime import errors

LABELS = ("flow", "step", "queue")

CLAIMED = Counter("pgflow_worker_tasks_claimed", "Tasks this process's workers claimed.", LABELS)
FINISHED = Counter(
    "pgflow_worker_tasks_finished",
    "Handlers that ended, by outcome: completed, failed (the handler raised or timed out: the"
    " task is retried or fails) or stopped (its run was cancelled; nothing is sent).",
    (*LABELS, "outcome"),
)
DURATION = Histogram(
    "pgflow_worker_handler_duration_seconds",
    "How long handlers ran, by outcome.",
    (*LABELS, "outcome"),
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900),
)
IN_FLIGHT = Gauge("pgflow_worker_tasks_in_flight", "Handlers running now.", LABELS)
RECONNECTS = Counter(
    "pgflow_worker_reconnects",
    "Times a worker's connection was lost and opened again, by what it was for.",
    ("flow", "queue", "purpose"),
)
UNCLAIMED = Counter(
    "pgflow_worker_unclaimed_messages",
    "Messages read but not claimed: foreign ones, of tasks already started or finished.",
    ("flow", "queue"),
)
HELD_BACK = Counter(
    "pgflow_worker_held_back_messages",
    "Messages a claim read and held back because their step was at a limit (max_in_flight or"
    " rate_limit): they come back when there is room, using no attempt.",
    ("flow", "queue"),
)
LIMITED_CLAIMS = Counter(
    "pgflow_worker_limited_claims",
    "Claims a step's limit cut short: the worker asked for more tasks than the step had room"
    " for, and the rest stayed in the queue.",
    ("flow", "queue"),
)
IGNORED = Counter(
    "pgflow_worker_results_ignored",
    "Results the engine ignored: their attempt was no longer the task's current one, or the"
    " task was cancelled meanwhile.",
    LABELS,
)


@dataclass
class _StepSeries:
    """One step's series of a worker, looked up once (a lookup by labels costs several times
    the increment)."""

    claimed: Any
    in_flight: Any
    ignored: Any
    outcomes: dict[str, tuple[Any, Any]] = field(default_factory=dict)


@dataclass
class WorkerMetrics:
    """One worker's view of the metrics above, its flow and queue bound. A task costs it about
    3 us (measured: the series' own locks and the histogram's buckets, most of it)."""

    flow_slug: str
    queue_name: str
    _steps: dict[str, _StepSeries] = field(default_factory=dict, repr=False)

    def _step(self, step_slug: str) -> _StepSeries:
        series = self._steps.get(step_slug)
        if series is None:
            labels = (self.flow_slug, step_slug, self.queue_name)
            series = self._steps[step_slug] = _StepSeries(
                CLAIMED.labels(*labels), IN_FLIGHT.labels(*labels), IGNORED.labels(*labels)
            )
        return series

    def claimed(self, step_slug: str) -> None:
        series = self._step(step_slug)
        series.claimed.inc()
        series.in_flight.inc()

    def finished(self, step_slug: str, outcome: str, seconds: float) -> None:
        series = self._step(step_slug)
        series.in_flight.dec()
        pair = series.outcomes.get(outcome)
        if pair is None:
            labels = (self.flow_slug, step_slug, self.queue_name, outcome)
            pair = series.outcomes[outcome] = (FINISHED.labels(*labels), DURATION.labels(*labels))
        pair[0].inc()
        pair[1].observe(seconds)

    def reconnected(self, purpose: str) -> None:
        RECONNECTS.labels(self.flow_slug, self.queue_name, purpose).inc()  # rare

    def unclaimed(self, count: int) -> None:
        UNCLAIMED.labels(self.flow_slug, self.queue_name).inc(count)  # rare

    def limited(self, held_back: int, cut_short: bool) -> None:
        """What a claim left for a step's limit: messages it held back, and whether it read
        fewer than it asked for."""
        if held_back:
            HELD_BACK.labels(self.flow_slug, self.queue_name).inc(held_back)
        if cut_short:
            LIMITED_CLAIMS.labels(self.flow_slug, self.queue_name).inc()

    def ignored(self, step_slug: str) -> None:
        self._step(step_slug).ignored.inc()


#: The servers this process runs: (host, port) -> (server, its thread, how many workers use it).
_SERVERS: dict[tuple[str, int], tuple[Any, Any, int]] = {}
_SERVERS_LOCK = threading.Lock()


class MetricsServer:
    """`/metrics` served from this process on (host, port), shared by the workers of the process
    that ask for the same address and stopped when the last of them stops."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.bound_port = port

    def start(self) -> None:
        """Serve, or join the server already serving this address; ConfigError when the port is
        taken by something else."""
        key = (self.host, self.port)
        with _SERVERS_LOCK:
            running = _SERVERS.get(key)
            if running is not None:
                server, thread, users = running
                _SERVERS[key] = (server, thread, users + 1)
                self.bound_port = server.server_port
                return
            try:
                server, thread = start_http_server(self.port, addr=self.host)
            except OSError as exc:
                raise errors.ConfigError(
                    f"Cannot serve metrics on {self.host}:{self.port}: {exc.strerror or exc}.",
                    hint="Pick another --metrics-port (PGFLOW_METRICS_PORT), or stop what"
                    " listens there.",
                ) from None
            _SERVERS[key] = (server, thread, 1)
            self.bound_port = server.server_port

    def stop(self) -> None:
        key = (self.host, self.port)
        with _SERVERS_LOCK:
            running = _SERVERS.get(key)
            if running is None:
                return
            server, thread, users = running
            if users > 1:
                _SERVERS[key] = (server, thread, users - 1)
                return
            del _SERVERS[key]
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

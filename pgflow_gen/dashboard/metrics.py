"""The engine's gauges for Prometheus, read from SQL at each scrape (the dashboard's `/metrics`,
`pgflow-gen metrics [--serve]`): per step queue its depth, visible messages, oldest message age
and messages ever sent; per step route its coverage, live workers, pause, waiting and running
tasks, stalled and parked tasks, and its limits with their use; runs by flow and status;
workers by state. Every series of a step carries its queue's name as the `queue` label. The
workers' own counters (tasks claimed, completed, failed, handler durations) come from each
worker process (`--metrics-port`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pgflow_gen.dashboard import data
from pgflow_gen.engine import dashboard_statements, support
from pgflow_gen.runtime.client import overrides_spec

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ROUTE_LABELS = ("flow", "step", "queue")


@dataclass(frozen=True)
class Snapshot:
    """What one scrape read."""

    routes: list[data.Route]
    runs: list[dict[str, Any]]
    stalled: list[dict[str, Any]]
    workers: list[dict[str, Any]]


async def snapshot(conn: psycopg.AsyncConnection[dict[str, Any]]) -> Snapshot:
    counted = dashboard_statements.worker_states(await support.version_async(conn))
    return Snapshot(
        routes=await data.routes(conn),
        runs=await (await conn.execute(dashboard_statements.RUNS_BY_STATUS)).fetchall(),
        stalled=await (await conn.execute(dashboard_statements.STALLED_TASKS)).fetchall(),
        workers=await (await conn.execute(counted, (True,))).fetchall(),
    )


def families(snap: Snapshot) -> Iterator[Metric]:
    """The metric families of a snapshot."""
    queues: dict[str, data.Route] = {}
    for route in snap.routes:
        queues.setdefault(route.queue_name, route)
    depth = GaugeMetricFamily(
        "pgflow_queue_messages", "Messages in the step queue (visible or not).", labels=["queue"]
    )
    visible = GaugeMetricFamily(
        "pgflow_queue_visible_messages", "Messages a worker could read now.", labels=["queue"]
    )
    oldest = GaugeMetricFamily(
        "pgflow_queue_oldest_message_age_seconds",
        "Age of the oldest message in the queue (0 when it is empty).",
        labels=["queue"],
    )
    sent = CounterMetricFamily(
        "pgflow_queue_sent_messages", "Messages ever sent to the queue.", labels=["queue"]
    )
    for name, route in sorted(queues.items()):
        if route.depth is None:  # the queue table is gone (a flow deleted meanwhile)
            continue
        depth.add_metric([name], route.depth)
        visible.add_metric([name], route.visible or 0)
        oldest.add_metric([name], route.oldest_age_s or 0)
        sent.add_metric([name], route.total_sent or 0)
    yield from (depth, visible, oldest, sent)

    covered = GaugeMetricFamily(
        "pgflow_route_covered", "1 when the step's queue has a live worker.", labels=ROUTE_LABELS
    )
    live = GaugeMetricFamily(
        "pgflow_route_live_workers", "Live workers on the step's route.", labels=ROUTE_LABELS
    )
    paused = GaugeMetricFamily(
        "pgflow_step_paused", "1 when the step is paused.", labels=ROUTE_LABELS
    )
    tasks = GaugeMetricFamily(
        "pgflow_step_tasks",
        "The step's tasks waiting (queued) and running (started).",
        labels=[*ROUTE_LABELS, "status"],
    )
    for route in snap.routes:
        labels = [route.flow_slug, route.step_slug, route.queue_name]
        covered.add_metric(labels, 1 if route.covered else 0)
        live.add_metric(labels, route.live_workers)
        paused.add_metric(labels, 1 if route.paused else 0)
        tasks.add_metric([*labels, "queued"], route.queued)
        tasks.add_metric([*labels, "started"], route.running)
    yield from (covered, live, paused, tasks)

    stalled = GaugeMetricFamily(
        "pgflow_stalled_tasks",
        "Started tasks whose worker is gone or whose lease ran out (stall recovery takes them).",
        labels=ROUTE_LABELS,
    )
    parked = GaugeMetricFamily(
        "pgflow_parked_tasks",
        "Tasks requeued too often by stall recovery and left for an operator.",
        labels=ROUTE_LABELS,
    )
    counted = {(row["flow_slug"], row["step_slug"]): row["stalled"] for row in snap.stalled}
    for route in snap.routes:
        labels = [route.flow_slug, route.step_slug, route.queue_name]
        stalled.add_metric(labels, counted.get((route.flow_slug, route.step_slug), 0))
        parked.add_metric(labels, route.parked)
    yield from (stalled, parked)

    cap = GaugeMetricFamily(
        "pgflow_step_max_in_flight",
        "The step's cap on tasks started at once, across every worker (only limited steps).",
        labels=ROUTE_LABELS,
    )
    in_flight = GaugeMetricFamily(
        "pgflow_step_limited_in_flight",
        "Tasks of a capped step started now, counted against its cap.",
        labels=ROUTE_LABELS,
    )
    rate = GaugeMetricFamily(
        "pgflow_step_rate_limit",
        "The step's task starts allowed in any window (only rate-limited steps).",
        labels=[*ROUTE_LABELS, "period_seconds"],
    )
    window = GaugeMetricFamily(
        "pgflow_step_rate_window_starts",
        "Task starts of a rate-limited step in its current window.",
        labels=ROUTE_LABELS,
    )
    per_key = GaugeMetricFamily(
        "pgflow_step_concurrency_limit",
        "Tasks of one key value a keyed step lets be queued or running at once (engine 0018).",
        labels=ROUTE_LABELS,
    )
    keys_waiting = GaugeMetricFamily(
        "pgflow_step_keys_waiting",
        "Key values of a keyed step with tasks waiting for room (parked).",
        labels=ROUTE_LABELS,
    )
    parked_tasks = GaugeMetricFamily(
        "pgflow_step_parked_by_key",
        "Tasks of a keyed step waiting for room under their key, without a message.",
        labels=ROUTE_LABELS,
    )
    overridden = GaugeMetricFamily(
        "pgflow_step_limits_overridden_since",
        "When an operator's limits began to override the step's spec (Unix seconds; only"
        " overridden steps, engine 0023).",
        labels=ROUTE_LABELS,
    )
    spec_cap = GaugeMetricFamily(
        "pgflow_step_spec_max_in_flight",
        "The cap the step's spec sets, under an operator's override (only overridden steps).",
        labels=ROUTE_LABELS,
    )
    spec_rate = GaugeMetricFamily(
        "pgflow_step_spec_rate_limit",
        "The rate limit the step's spec sets, under an operator's override (only overridden"
        " steps).",
        labels=[*ROUTE_LABELS, "period_seconds"],
    )
    for route in snap.routes:
        limits = route.limits
        if limits is None:
            continue
        labels = [route.flow_slug, route.step_slug, route.queue_name]
        if limits["max_in_flight"] is not None:
            cap.add_metric(labels, limits["max_in_flight"])
            in_flight.add_metric(labels, limits["in_flight"])
        if limits["rate_limit"] is not None:
            rate.add_metric([*labels, str(limits["rate_period_s"])], limits["rate_limit"])
            window.add_metric(labels, limits["window_starts"])
        if limits.get("limit_per_key") is not None:
            per_key.add_metric(labels, limits["limit_per_key"])
            keys_waiting.add_metric(labels, limits["keys_waiting"])
            parked_tasks.add_metric(labels, limits["parked"])
        if overrides_spec(limits):
            overridden.add_metric(labels, limits["overridden_at"].timestamp())
            if limits["spec_max_in_flight"] is not None:
                spec_cap.add_metric(labels, limits["spec_max_in_flight"])
            if limits["spec_rate_limit"] is not None:
                period = str(limits["spec_rate_period_s"])
                spec_rate.add_metric([*labels, period], limits["spec_rate_limit"])
    yield from (cap, in_flight, rate, window, per_key, keys_waiting, parked_tasks)
    yield from (overridden, spec_cap, spec_rate)

    runs = GaugeMetricFamily(
        "pgflow_runs", "Runs in the tables by flow and status.", labels=["flow", "status"]
    )
    for row in snap.runs:
        runs.add_metric([row["flow_slug"], row["status"]], row["runs"])
    workers = GaugeMetricFamily(
        "pgflow_workers", "Registered workers by state.", labels=[*ROUTE_LABELS, "state"]
    )
    for row in snap.workers:
        workers.add_metric(
            [row["flow_slug"], row["step_slug"], row["queue_name"], row["state"]], row["workers"]
        )
    yield from (runs, workers)


class _Fixed(Collector):
    def __init__(self, metrics: Iterable[Metric]) -> None:
        self._metrics = list(metrics)

    def collect(self) -> Iterable[Metric]:
        return self._metrics


def exposition(snap: Snapshot) -> bytes:
    """The Prometheus text exposition of a snapshot."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(families(snap)))
    return generate_latest(registry)

"""The worker liveness rule, the one place in Python that spells it.

A worker heartbeats every `heartbeat_interval` seconds; it counts as live (coverage, `workers`,
`start --wait`) while its last heartbeat is younger than `live_within`, and stall recovery takes
its tasks once it is older than `stalled_after`. The engine's twin is `pgflow.worker_liveness()`
(engine 0008), where an operator may change the rule per database (`pgflow.stalled_after`...);
a worker reads the engine's rule when it starts.
A test keeps the two in step.

>>> DEFAULT.live_within / DEFAULT.heartbeat_interval
3.0
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Liveness:
    """The three numbers of the rule, in seconds."""

    heartbeat_interval: float
    live_within: float
    stalled_after: float


#: The engine's defaults (pgflow.worker_liveness() without settings).
DEFAULT = Liveness(heartbeat_interval=5.0, live_within=15.0, stalled_after=30.0)

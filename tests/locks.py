"""Deterministic waits for lock-ordering tests: poll pg_stat_activity with a deadline."""

from __future__ import annotations

import time
from typing import Any

import psycopg

DEADLINE_S = 30.0


def wait_until_blocked(observer: psycopg.Connection[Any], pids: dict[str, Any], key: str) -> None:
    """Wait until the backend whose pid a thread stores in `pids[key]` waits for a lock."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        pid = pids.get(key)
        if pid is not None:
            row = observer.execute(
                "select wait_event_type from pg_stat_activity where pid = %s", (pid,)
            ).fetchone()
            if row is not None and row[0] == "Lock":
                return
        time.sleep(0.01)  # polling interval, bounded by the deadline above
    raise AssertionError(f"{key} never blocked on a lock within {DEADLINE_S} s")

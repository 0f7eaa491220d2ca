"""A worker on a database that misbehaves without going away: a lock held on the rows its
results need, a lock timeout, an operator's pg_cancel_backend. A result in hand is never turned
into a failure or lost, and a live worker's tasks are never taken by stall recovery."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgflow_gen.runtime import (
    Client,
    Context,
    Flow,
    FlowOptions,
    Step,
    Worker,
    with_step_queues,
)

FLOW: Flow[str, dict[str, int], Any] = Flow(slug="trouble", steps=(Step(slug="work"),))
QUEUED = with_step_queues(FLOW)
DEADLINE_S = 30.0


def eventually(check: Callable[[], bool], what: str) -> None:
    """Poll `check` until it holds, failing after DEADLINE_S."""
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def set_database(url: str, **settings: str) -> None:
    """ALTER DATABASE ... SET for the connections opened from now on."""
    with psycopg.connect(url, autocommit=True) as conn:
        name = sql.Identifier(conn.info.dbname)
        for key, value in settings.items():
            conn.execute(
                sql.SQL("alter database {} set {} = {}").format(
                    name, sql.Identifier(*key.split("__")), sql.Literal(value)
                )
            )


@contextlib.contextmanager
def run_row_locked(url: str, run_id: uuid.UUID) -> Iterator[psycopg.Connection[Any]]:
    """Hold `for update` on a run's row (what completing its tasks locks first) until exit."""
    with psycopg.connect(url) as conn:
        conn.execute("select 1 from pgflow.runs where run_id = %s for update", (run_id,))
        yield conn
        conn.rollback()


def sweep_and_requeue_nothing(url: str, seconds: float) -> None:
    """Run stall recovery every 0.1 s for `seconds` (the lock is held that long: the point is
    the duration, not a wait for an event), asserting each sweep requeues nothing."""
    with psycopg.connect(url, autocommit=True) as sweeper:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            assert sweeper.execute("select pgflow.requeue_stalled_tasks()").fetchone() == (0,)
            time.sleep(0.1)


class Gates:
    """A sync handler whose calls wait, per run input n, until `open(n)`."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self._gates: dict[int, threading.Event] = {}
        self._lock = threading.Lock()

    def gate(self, n: int) -> threading.Event:
        with self._lock:
            return self._gates.setdefault(n, threading.Event())

    def handler(self, flow_input: dict[str, int], ctx: Context[dict[str, int]], /) -> Any:
        n = flow_input["n"]
        with self._lock:
            self.calls.append(n)
        assert self.gate(n).wait(DEADLINE_S)
        return {"doubled": n * 2}

    def running(self, n: int) -> bool:
        with self._lock:
            return n in self.calls


def serve(url: str, gates: Gates, body: Callable[[], None]) -> None:
    """Run a step worker in process (its own event loop) while `body` runs in a thread."""

    async def main() -> None:
        async with Worker(
            QUEUED, step_slug="work", handler=gates.handler, database_url=url, poll_interval=0.1
        ):
            await asyncio.to_thread(body)

    asyncio.run(main())


def task_row(url: str, run_id: uuid.UUID) -> dict[str, Any]:
    with psycopg.connect(url) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        row = cur.execute(
            "select t.status, t.attempts_count, t.requeued_count, t.output, r.status as run_status"
            " from pgflow.step_tasks as t join pgflow.runs as r using (run_id)"
            " where t.run_id = %s",
            (run_id,),
        ).fetchone()
    assert row is not None
    return row


def completed_once(url: str, run_id: uuid.UUID, n: int) -> bool:
    row = task_row(url, run_id)
    if row["run_status"] != "completed":
        return False
    assert row == {
        "status": "completed",
        "attempts_count": 1,
        "requeued_count": 0,
        "output": {"doubled": n * 2},
        "run_status": "completed",
    }
    return True


def test_a_lock_timeout_while_completing_keeps_the_result_until_it_is_sent(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    set_database(db_url, lock_timeout="100ms")
    gates = Gates()
    client = Client(db_url)

    def body() -> None:
        run_id = client.start_flow(QUEUED, {"n": 1}).run_id
        eventually(lambda: gates.running(1), "the handler")
        with run_row_locked(db_url, run_id):
            gates.gate(1).set()
            eventually(lambda: "SQLSTATE 55P03" in caplog.text, "a lock timeout while sending")
            assert task_row(db_url, run_id)["status"] == "started"
        eventually(lambda: completed_once(db_url, run_id, 1), "the task completed")

    with caplog.at_level(logging.INFO):
        serve(db_url, gates, body)
    assert gates.calls == [1]
    assert "results sent again after" in caplog.text


def test_a_cancelled_completion_keeps_the_result_until_it_is_sent(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    gates = Gates()
    client = Client(db_url)

    def waiting_completion(conn: psycopg.Connection[Any]) -> int | None:
        row = conn.execute(
            "select pid from pg_stat_activity where wait_event_type = 'Lock'"
            " and query like '%%pgflow.complete_task%%'"
        ).fetchone()
        return None if row is None else int(row[0])

    def body() -> None:
        run_id = client.start_flow(QUEUED, {"n": 2}).run_id
        eventually(lambda: gates.running(2), "the handler")
        with run_row_locked(db_url, run_id), psycopg.connect(db_url, autocommit=True) as admin:
            gates.gate(2).set()
            eventually(lambda: waiting_completion(admin) is not None, "the completion waiting")
            admin.execute("select pg_cancel_backend(%s)", (waiting_completion(admin),))
            eventually(lambda: "SQLSTATE 57014" in caplog.text, "the cancel seen")
            assert task_row(db_url, run_id)["status"] == "started"
        eventually(lambda: completed_once(db_url, run_id, 2), "the task completed")

    with caplog.at_level(logging.INFO):
        serve(db_url, gates, body)
    assert gates.calls == [2]


def test_a_live_worker_whose_results_wait_on_a_lock_past_the_stall_threshold_keeps_its_tasks(
    db_url: str,
) -> None:
    # The rule, fast: heartbeat every 0.2 s, stalled after 1 s without one.
    set_database(
        db_url,
        pgflow__heartbeat_interval="0.2s",
        pgflow__live_within="0.5s",
        pgflow__stalled_after="1s",
    )
    gates = Gates()
    client = Client(db_url)

    def body() -> None:
        quick = client.start_flow(QUEUED, {"n": 1}).run_id
        long = client.start_flow(QUEUED, {"n": 2}).run_id
        eventually(lambda: gates.running(1) and gates.running(2), "both handlers")
        with run_row_locked(db_url, quick):
            gates.gate(1).set()  # its result now waits for the lock; the long one runs on
            sweep_and_requeue_nothing(db_url, 3.0)  # three times the stall threshold
        eventually(lambda: completed_once(db_url, quick, 1), "the quick task completed")
        gates.gate(2).set()
        eventually(lambda: completed_once(db_url, long, 2), "the long task completed")

    serve(db_url, gates, body)
    assert sorted(gates.calls) == [1, 2]  # each ran once


def test_a_message_whose_run_was_deleted_is_archived_once_and_logged(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    gates = Gates()
    serve(db_url, gates, lambda: None)  # compiles the flow
    run_id = Client(db_url).start_flow(QUEUED, {"n": 3}).run_id
    with psycopg.connect(db_url, autocommit=True) as conn:
        [msg_id] = conn.execute("select msg_id from pgmq.q_trouble__work").fetchone() or [None]
        for table in ("step_tasks", "step_states", "runs"):  # behind the engine's back
            conn.execute(
                sql.SQL("delete from pgflow.{} where run_id = %s").format(sql.Identifier(table)),
                (run_id,),
            )
    archived = f"archived 1 message in queue trouble__work, ids {msg_id}: their task no longer"

    with caplog.at_level(logging.INFO):
        serve(db_url, gates, lambda: eventually(lambda: archived in caplog.text, "the log"))
    with psycopg.connect(db_url) as conn:
        assert conn.execute("select count(*) from pgmq.q_trouble__work").fetchone() == (0,)
        assert conn.execute("select msg_id from pgmq.a_trouble__work").fetchall() == [(msg_id,)]
    assert "unclaimed" not in caplog.text
    assert gates.calls == []


def test_a_result_that_waits_on_a_lock_past_its_timeout_keeps_its_lease(db_url: str) -> None:
    # The lease: the step's timeout (3 s) + stalled_after (1 s); the lock is held for 6 s.
    set_database(
        db_url,
        pgflow__heartbeat_interval="0.2s",
        pgflow__live_within="0.5s",
        pgflow__stalled_after="1s",
    )
    quick: Flow[str, dict[str, int], Any] = Flow(
        slug="trouble", options=FlowOptions(timeout=3), steps=(Step(slug="work"),)
    )
    gates = Gates()
    client = Client(db_url)

    def body() -> None:
        run_id = client.start_flow(with_step_queues(quick), {"n": 4}).run_id
        eventually(lambda: gates.running(4), "the handler")
        with run_row_locked(db_url, run_id):
            gates.gate(4).set()  # the result now waits for the lock
            sweep_and_requeue_nothing(db_url, 6.0)  # past the 4 s lease
        eventually(lambda: completed_once(db_url, run_id, 4), "the task completed")

    async def main() -> None:
        async with Worker(
            with_step_queues(quick), step_slug="work", handler=gates.handler, database_url=db_url,
            poll_interval=0.1,
        ):  # fmt: skip
            await asyncio.to_thread(body)

    asyncio.run(main())
    assert gates.calls == [4]

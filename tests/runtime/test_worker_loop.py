"""The worker loop's logic, driven through its database seam with an in-memory fake engine
(tests/runtime/fake_session.py): slots, unsent results, leases of its own messages, drain,
deprecation and reconnects. Against PostgreSQL the same behaviour is tested end to end."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from pgflow_gen.runtime import Flow, Step, with_step_queues
from pgflow_gen.runtime.worker import loop as worker_loop
from pgflow_gen.runtime.worker import reporter, startup
from pgflow_gen.runtime.worker.process import assignment_for
from pgflow_gen.runtime.worker.settings import WorkerSettings
from tests.runtime.fake_session import FakeEngine

FLOW: Flow[str, Any, Any] = Flow(slug="fake", steps=(Step(slug="work"),))
QUEUED = with_step_queues(FLOW)
LOG = logging.getLogger("tests.worker_loop")
DEADLINE_S = 30.0


async def until(check: Callable[[], bool], what: str) -> None:
    """Poll `check` on the event loop until it holds (a deadline, not a sleep)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def worker(engine: FakeEngine, handler: Any, **tuning: Any) -> worker_loop.WorkerLoop:
    settings = {"poll_interval": 0.02, "notifications": False, "shutdown_grace": 5.0, **tuning}
    assignment = assignment_for(QUEUED, step_slug="work", handler=handler, handlers=None)
    return worker_loop.WorkerLoop(
        assignment, WorkerSettings(**settings), "postgresql://unused", LOG, connect=engine.connect
    )


def gated() -> tuple[Callable[..., Any], threading.Event, list[int]]:
    """A sync handler that waits for a gate, and the most handlers seen running at once."""
    gate = threading.Event()
    running = [0, 0]  # now, most
    lock = threading.Lock()

    def handler(value: int, ctx: Any, /) -> int:
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
        try:
            assert gate.wait(DEADLINE_S)
            return value * 10
        finally:
            with lock:
                running[0] -= 1

    return handler, gate, running


def test_no_more_handlers_than_slots_and_every_task_once() -> None:
    engine = FakeEngine("fake", "work")
    engine.enqueue(10)
    handler, gate, running = gated()

    async def main() -> None:
        loop = worker(engine, handler, max_concurrent=3, batch_size=10)
        serving = asyncio.create_task(loop.run(handle_signals=False))
        await until(lambda: sum(map(len, engine.claims)) == 3, "three claims")
        assert max(map(len, engine.claims)) <= 3  # reads only as many as free slots
        gate.set()
        await until(lambda: engine.finished == 10, "every task reported")
        loop.begin_drain("test over")
        await serving

    asyncio.run(main())
    assert running[1] == 3
    assert {msg_id: results for msg_id, results in engine.results.items()} == {
        msg_id: [(msg_id - 1) * 10] for msg_id in range(1, 11)
    }
    assert engine.stopped


def test_results_kept_through_an_outage_hold_their_slots_and_are_sent_once() -> None:
    engine = FakeEngine("fake", "work")
    engine.enqueue(4)
    handler, gate, _ = gated()

    async def main() -> None:
        loop = worker(engine, handler, max_concurrent=2)
        serving = asyncio.create_task(loop.run(handle_signals=False))
        await until(lambda: sum(map(len, engine.claims)) == 2, "two claims")
        engine.results_down = True  # the poller's connection still works
        gate.set()
        await until(lambda: len(loop.slots.reports) == 2, "two results waiting")
        # Reconnecting takes 0.25 + 0.5 + 1 s; the poller polls every 0.02 s meanwhile.
        await until(lambda: engine.refused_connections >= 3, "three reconnect attempts")
        assert sum(map(len, engine.claims)) == 2  # no slot free while results wait
        engine.results_down = False
        await until(lambda: engine.finished == 4, "every task reported")
        loop.begin_drain("test over")
        await serving

    asyncio.run(main())
    assert all(len(results) == 1 for results in engine.results.values())


def test_deprecation_drains_the_worker_and_marks_it_stopped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = FakeEngine("fake", "work")

    async def main() -> None:
        loop = worker(engine, lambda value, ctx, /: value)
        serving = asyncio.create_task(loop.run(handle_signals=False))
        await until(lambda: engine.heartbeats > 0, "a heartbeat")
        engine.deprecated = True
        await asyncio.wait_for(serving, DEADLINE_S)

    with caplog.at_level(logging.INFO, logger=LOG.name):
        asyncio.run(main())
    assert engine.stopped
    assert any("deprecated by an operator, draining" in m for m in caplog.messages)


def test_a_drain_lets_running_handlers_finish_and_report() -> None:
    engine = FakeEngine("fake", "work")
    engine.enqueue(2)
    handler, gate, _ = gated()

    async def main() -> None:
        loop = worker(engine, handler, max_concurrent=1)
        serving = asyncio.create_task(loop.run(handle_signals=False))
        await until(lambda: sum(map(len, engine.claims)) == 1, "one claim")
        loop.begin_drain("test over")
        gate.set()
        await asyncio.wait_for(serving, DEADLINE_S)

    asyncio.run(main())
    assert list(engine.results) == [1]  # the running one finished; the queued one stays
    assert 2 in engine.queued
    assert engine.stopped


def test_own_messages_read_again_get_their_lease_back_and_foreign_ones_are_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = FakeEngine("fake", "work")
    [mine] = engine.enqueue(1, timeout=40)
    handler, gate, _ = gated()

    async def main() -> None:
        loop = worker(engine, handler, max_concurrent=2)
        serving = asyncio.create_task(loop.run(handle_signals=False))
        await until(lambda: engine.claims[:1] == [[mine]], "the claim")
        engine.show(mine)  # visible again while its handler runs
        engine.visible_at[99] = 0.0  # a message of no task of this worker
        await until(lambda: any(m == mine for m, _ in engine.leases), "the lease back")
        await until(lambda: 99 not in engine.visible_at or engine.visible_at[99] > 0, "a read")
        gate.set()
        await until(lambda: engine.finished == 1, "the result")
        loop.begin_drain("test over")
        await serving

    with caplog.at_level(logging.INFO, logger=LOG.name):
        asyncio.run(main())
    [(_, offset)] = [lease for lease in engine.leases if lease[0] == mine]
    assert 40 <= offset <= 42  # the time to its timeout + 2 s
    unclaimed = [m for m in caplog.messages if "unclaimed" in m]
    assert unclaimed
    assert all("ids 99:" in m for m in unclaimed)


def test_a_stale_result_is_logged_and_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    engine = FakeEngine("fake", "work", current_attempt=2)
    engine.enqueue(1)

    async def main() -> None:
        loop = worker(engine, lambda value, ctx, /: value)
        serving = asyncio.create_task(loop.run(handle_signals=False))
        await until(lambda: any("ignored the result" in m for m in caplog.messages), "the log")
        loop.begin_drain("test over")
        await serving

    with caplog.at_level(logging.INFO, logger=LOG.name):
        asyncio.run(main())
    assert engine.results == {}


def test_an_older_spec_than_the_databases_is_a_warning_and_the_worker_serves(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kept = "verified; kept the options and input schema adopted at 2026-12-01 10:00:00+00"
    engine = FakeEngine("fake", "work", compilation=startup.Compilation(kept, True))
    engine.enqueue(1)

    async def main() -> None:
        loop = worker(engine, lambda value, ctx, /: value)
        serving = asyncio.create_task(loop.run(handle_signals=False))
        await until(lambda: bool(engine.results), "the result")
        loop.begin_drain("test over")
        await serving

    with caplog.at_level(logging.INFO, logger=LOG.name):
        asyncio.run(main())
    [record] = [r for r in caplog.records if "kept the options" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert record.getMessage().endswith(
        f"flow fake {kept} (this worker's spec is older: rebuild it, or apply the flow's"
        " generated migration to adopt its options and input schema again)"
    )


@pytest.mark.parametrize("check_outputs", [True, False])
def test_outputs_are_checked_against_their_type_unless_turned_off(check_outputs: bool) -> None:
    typed: Flow[str, Any, Any] = Flow(
        slug="fake", steps=(Step(slug="work", output_schema={"type": "string"}),)
    )
    engine = FakeEngine("fake", "work")
    engine.enqueue(1)
    assignment = assignment_for(
        with_step_queues(typed), step_slug="work", handler=lambda v, ctx, /: {"not": "a string"},
        handlers=None,
    )  # fmt: skip
    tuning = WorkerSettings(poll_interval=0.02, notifications=False, check_outputs=check_outputs)

    async def main() -> None:
        loop = worker_loop.WorkerLoop(
            assignment, tuning, "postgresql://unused", LOG, connect=engine.connect
        )
        serving = asyncio.create_task(loop.run(handle_signals=False))
        await until(lambda: engine.finished == 1, "the result")
        loop.begin_drain("test over")
        await serving

    asyncio.run(main())
    [result] = engine.results[1]
    if check_outputs:
        assert result == (
            'OutputValidationError: Step "work" returned an output that does not match its type:'
            " $: expected string, got object."
        )
    else:
        assert result == {"not": "a string"}


def test_a_worker_whose_row_is_gone_registers_again_at_its_heartbeat() -> None:
    engine = FakeEngine("fake", "work")

    async def main() -> None:
        loop = worker(engine, lambda value, ctx, /: value)
        serving = asyncio.create_task(loop.run(handle_signals=False))
        await asyncio.wait_for(loop.started.wait(), DEADLINE_S)
        await until(lambda: engine.heartbeats > 0, "a heartbeat")
        registered = engine.registrations
        engine.explode["heartbeat"] = psycopg.errors.NoDataFound("Worker is not registered.")
        await until(lambda: engine.registrations > registered, "a new registration")
        del engine.explode["heartbeat"]
        beats = engine.heartbeats
        await until(lambda: engine.heartbeats > beats, "heartbeats again")
        loop.begin_drain("test over")
        await serving

    asyncio.run(main())


def test_a_busy_worker_sends_its_results_with_its_next_claim() -> None:
    engine = FakeEngine("fake", "work")
    engine.enqueue(40)

    async def main() -> None:
        loop = worker(engine, lambda value, ctx, /: value, max_concurrent=4, batch_size=4)
        serving = asyncio.create_task(loop.run(handle_signals=False))
        await until(lambda: engine.finished == 40, "every task reported")
        loop.begin_drain("test over")
        await serving

    asyncio.run(main())
    assert sum(engine.joint) > 0  # results went with claims
    assert sum(engine.joint) + sum(engine.batches) == 40
    assert sorted(engine.results) == list(range(1, 41))
    assert all(len(results) == 1 for results in engine.results.values())


def test_a_result_that_finishes_while_others_run_waits_for_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reporter, "REPORT_LINGER_S", 60.0)  # longer than the test may take
    engine = FakeEngine("fake", "work")
    engine.enqueue(2)  # fewer than a claim asks for: results go apart from claims
    gates = [threading.Event(), threading.Event()]

    def handler(value: int, ctx: Any, /) -> int:
        assert gates[value].wait(DEADLINE_S)
        return value

    async def main() -> None:
        loop = worker(engine, handler, max_concurrent=3, batch_size=3)
        serving = asyncio.create_task(loop.run(handle_signals=False))
        await until(lambda: sum(map(len, engine.claims)) == 2, "two claims")
        gates[0].set()
        await until(lambda: len(loop.slots.reports) == 1, "the first result")
        await asyncio.sleep(0.2)  # a window in which nothing may be sent
        assert engine.batches == []  # it waits: the other handler still runs
        gates[1].set()
        await until(lambda: engine.finished == 2, "every task reported")
        loop.begin_drain("test over")
        await serving

    asyncio.run(main())
    assert engine.batches == [2]
    assert engine.joint == []


def test_a_lone_result_is_sent_without_waiting_for_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reporter, "REPORT_LINGER_S", 2 * DEADLINE_S)
    engine = FakeEngine("fake", "work")
    engine.enqueue(1)

    async def main() -> None:
        loop = worker(engine, lambda value, ctx, /: value, max_concurrent=3)
        serving = asyncio.create_task(loop.run(handle_signals=False))
        # Nothing else runs, so it does not wait out the linger (twice this deadline).
        await until(lambda: engine.finished == 1, "the result sent")
        loop.begin_drain("test over")
        await serving

    asyncio.run(main())
    assert engine.batches == [1]

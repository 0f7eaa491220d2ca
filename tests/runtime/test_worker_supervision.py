"""The worker's parts run supervised (runtime/worker/supervision.py): one that fails unexpectedly is
logged with its traceback and stops the worker, which still drains, marks itself stopped, closes
every connection and ends with WorkerFailedError; a shutdown step that raises does not skip the
others. The heartbeat has a connection of its own, so held-up results never delay it. Driven
through the in-memory session (tests/runtime/fake_session.py)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from pgflow_gen.runtime import errors
from pgflow_gen.runtime.worker.process import run_main
from tests.runtime.fake_session import FakeEngine
from tests.runtime.test_worker_loop import DEADLINE_S, LOG, gated, until, worker

#: Each part, and the session call whose error reaches it unhandled.
PARTS = [
    ("heartbeat", "heartbeat"),
    ("reporter", "requeue_stalled"),
    ("poller", "read_and_claim"),
    ("listener", "listen"),
]


def every_session_closed(engine: FakeEngine) -> bool:
    return bool(engine.sessions) and all(session.closed for session in engine.sessions)


@pytest.mark.parametrize(("part", "call"), PARTS)
def test_a_part_that_fails_stops_the_worker_after_every_cleanup_step(
    part: str, call: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = FakeEngine("fake", "work", notifications=True)
    loop = worker(engine, lambda value, ctx, /: value, recovery_interval=0.02, notifications=True)

    async def main() -> None:
        engine.explode[call] = RuntimeError(f"bug in {call}")  # no startup step makes this call
        serving = asyncio.create_task(loop.run(handle_signals=False))
        with pytest.raises(errors.WorkerFailedError) as failed:
            await asyncio.wait_for(serving, DEADLINE_S)
        assert loop.started.is_set()
        assert str(failed.value).startswith(
            f"Worker fake-work stopped because its {part} failed: RuntimeError: bug in {call}."
        )

    with caplog.at_level(logging.INFO, logger=LOG.name):
        asyncio.run(main())
    [record] = [r for r in caplog.records if "failed unexpectedly" in r.getMessage()]
    assert record.getMessage() == (
        f"worker fake-work: its {part} failed unexpectedly; stopping the worker"
    )
    assert record.exc_info is not None
    assert f"bug in {call}" in str(record.exc_info[1])
    assert any(f"its {part} failed, draining" in m for m in caplog.messages)
    assert engine.stopped  # marked stopped
    assert every_session_closed(engine)
    assert loop.slots._executor._shutdown  # the handler threads' pool is shut down


def test_a_worker_whose_heartbeat_fails_still_finishes_and_reports_its_running_task() -> None:
    engine = FakeEngine("fake", "work")
    engine.enqueue(1)
    handler, gate, _ = gated()
    loop = worker(engine, handler)

    async def main() -> None:
        serving = asyncio.create_task(loop.run(handle_signals=False))
        await until(lambda: sum(map(len, engine.claims)) == 1, "the claim")
        engine.explode["heartbeat"] = RuntimeError("bug")
        await until(lambda: loop.slots.shutdown.is_set(), "the drain")
        gate.set()
        with pytest.raises(errors.WorkerFailedError):
            await asyncio.wait_for(serving, DEADLINE_S)

    asyncio.run(main())
    assert engine.results == {1: [0]}  # the handler's output, sent while draining
    assert engine.stopped


def test_a_shutdown_step_that_raises_does_not_skip_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = FakeEngine("fake", "work", notifications=True)
    engine.explode["mark_stopped"] = RuntimeError("bug in mark_stopped")
    loop = worker(engine, lambda value, ctx, /: value, notifications=True)

    async def main() -> None:
        serving = asyncio.create_task(loop.run(handle_signals=False))
        await asyncio.wait_for(loop.started.wait(), DEADLINE_S)
        loop.begin_drain("test over")
        with pytest.raises(
            errors.WorkerFailedError, match="because marking the worker stopped failed"
        ):
            await asyncio.wait_for(serving, DEADLINE_S)

    with caplog.at_level(logging.INFO, logger=LOG.name):
        asyncio.run(main())
    assert any(m == "worker fake-work: marking the worker stopped failed" for m in caplog.messages)
    assert every_session_closed(engine)
    assert loop.slots._executor._shutdown


def test_a_failed_worker_is_one_logged_line_and_exit_status_1(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = FakeEngine("fake", "work")
    loop = worker(engine, lambda value, ctx, /: value)

    async def serve() -> None:
        serving = asyncio.create_task(loop.run(handle_signals=False))
        await asyncio.wait_for(loop.started.wait(), DEADLINE_S)
        engine.explode["heartbeat"] = RuntimeError("bug")
        await serving

    with caplog.at_level(logging.INFO):
        assert run_main(lambda: asyncio.run(serve())) == 1
    [last] = [r for r in caplog.records if r.name == "pgflow_gen.worker"]
    assert last.levelname == "ERROR"
    assert last.getMessage().startswith(
        "WorkerFailedError: Worker fake-work stopped because its heartbeat failed: RuntimeError:"
        " bug."
    )
    assert last.exc_info is None  # the traceback was logged once, where it happened


def test_the_heartbeat_goes_on_while_results_wait_for_a_lock() -> None:
    engine = FakeEngine("fake", "work")
    engine.enqueue(1)
    gate = asyncio.Event()
    loop = worker(engine, lambda value, ctx, /: value)

    async def main() -> None:
        engine.results_gate = gate
        serving = asyncio.create_task(loop.run(handle_signals=False))
        await until(lambda: sum(map(len, engine.claims)) == 1, "the claim")
        await until(lambda: len(loop.slots.reports) == 1, "the result waiting")
        assert loop.heartbeat is not None
        beats = loop.heartbeat.beats
        await until(lambda: loop.heartbeat is not None and loop.heartbeat.beats >= beats + 5,
                    "five heartbeats while the result waits")  # fmt: skip
        assert engine.finished == 0
        gate.set()
        await until(lambda: engine.finished == 1, "the result")
        loop.begin_drain("test over")
        await serving

    asyncio.run(main())
    assert engine.results == {1: [0]}


def test_a_heartbeat_that_gets_no_answer_opens_a_new_connection() -> None:
    engine = FakeEngine("fake", "work")
    loop = worker(engine, lambda value, ctx, /: value)

    async def main() -> None:
        serving = asyncio.create_task(loop.run(handle_signals=False))
        await until(lambda: engine.heartbeats > 0, "a heartbeat")
        engine.heartbeat_hangs = True
        opened = len(engine.sessions)
        await until(lambda: len(engine.sessions) > opened, "a new heartbeat connection")
        assert any(s.closed for s in engine.sessions[:opened])  # the silent one was dropped
        engine.heartbeat_hangs = False
        assert loop.heartbeat is not None
        beats = loop.heartbeat.beats
        await until(lambda: loop.heartbeat is not None and loop.heartbeat.beats > beats, "beats")
        loop.begin_drain("test over")
        await serving

    asyncio.run(main())


def test_results_that_wait_keep_their_leases_renewed() -> None:
    engine = FakeEngine("fake", "work")
    [msg_id] = engine.enqueue(1)
    gate = asyncio.Event()
    loop = worker(engine, lambda value, ctx, /: value)

    async def main() -> None:
        engine.results_gate = gate
        serving = asyncio.create_task(loop.run(handle_signals=False))
        await until(lambda: engine.renewed.count(msg_id) >= 3, "three renewals")
        gate.set()
        await until(lambda: engine.finished == 1, "the result")
        renewals = len(engine.renewed)
        assert loop.heartbeat is not None
        beats = loop.heartbeat.beats
        await until(lambda: loop.heartbeat is not None and loop.heartbeat.beats > beats + 2,
                    "more beats")  # fmt: skip
        assert len(engine.renewed) == renewals  # nothing left to renew once it is sent
        loop.begin_drain("test over")
        await serving

    asyncio.run(main())

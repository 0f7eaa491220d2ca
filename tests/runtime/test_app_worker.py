"""Workers inside an asyncio application: `Worker` (async with / start / stop) and `run_worker`,
several step workers in one process and one event loop, each on its own queue."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest

from pgflow_gen.runtime import (
    Client,
    Context,
    Flow,
    Step,
    Worker,
    WorkerSettings,
    errors,
    run_worker,
    with_step_queues,
)

FLOW: Flow[str, dict[str, int], Any] = Flow(
    slug="embedded", steps=(Step(slug="double"), Step(slug="plus", dependencies=("double",)))
)
QUEUED = with_step_queues(FLOW)


def double(flow_input: dict[str, int], ctx: Context[dict[str, int]], /) -> int:
    return flow_input["n"] * 2


async def plus(deps: dict[str, int], ctx: Context[dict[str, int]], /) -> int:
    return deps["double"] + 1


async def finished_output(url: str, n: int) -> Any:
    def start_and_wait() -> Any:
        run = Client(url).start_flow(QUEUED, {"n": n}).wait(timeout=60)
        assert run.status == "completed", run.failure
        return run.output

    return await asyncio.to_thread(start_and_wait)


def workers_of(url: str) -> dict[str, tuple[str, bool]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "select worker_id, queue_name, stopped_at is not null from pgflow.workers"
        ).fetchall()
    return {str(worker_id): (queue, stopped) for worker_id, queue, stopped in rows}


def test_two_step_workers_share_one_event_loop(db_url: str) -> None:
    async def main() -> list[uuid.UUID | None]:
        first = Worker(QUEUED, step_slug="double", handler=double, database_url=db_url)
        second = Worker(QUEUED, step_slug="plus", handler=plus, database_url=db_url)
        async with first, second:
            assert first.running
            assert second.running
            outputs = await asyncio.gather(*(finished_output(db_url, n) for n in range(5)))
            assert outputs == [{"plus": n * 2 + 1} for n in range(5)]
        assert not first.running
        return [first.worker_id, second.worker_id]

    ids = asyncio.run(main())
    workers = workers_of(db_url)
    assert {workers[str(i)] for i in ids} == {("embedded__double", True), ("embedded__plus", True)}


def test_run_worker_serves_until_cancelled_then_drains(db_url: str) -> None:
    async def main() -> Any:
        serving = [
            asyncio.create_task(run_worker(QUEUED, step_slug=slug, handler=fn, database_url=db_url))
            for slug, fn in (("double", double), ("plus", plus))
        ]
        deadline = asyncio.get_running_loop().time() + 30
        while len(await asyncio.to_thread(workers_of, db_url)) < 2:  # both compiled, registered
            assert asyncio.get_running_loop().time() < deadline, "the workers did not start"
            await asyncio.sleep(0.05)
        output = await finished_output(db_url, 20)
        for task in serving:
            task.cancel()
        results = await asyncio.gather(*serving, return_exceptions=True)
        assert all(isinstance(r, asyncio.CancelledError) for r in results)
        return output

    assert asyncio.run(main()) == {"plus": 41}
    assert {stopped for _, stopped in workers_of(db_url).values()} == {True}


def test_configuration_mistakes_raise_before_anything_starts() -> None:
    with pytest.raises(errors.ConfigError, match='has no step "Double"'):
        Worker(QUEUED, step_slug="Double", handler=double)
    with pytest.raises(errors.ConfigError, match="max_concurrent=0"):
        Worker(FLOW, handlers={"double": double, "plus": plus}, max_concurrent=0)


def test_startup_errors_are_raised_by_start(empty_db_url: str) -> None:
    async def main() -> None:
        async with Worker(QUEUED, step_slug="double", handler=double, database_url=empty_db_url):
            raise AssertionError("never started")

    with pytest.raises(errors.DatabaseError, match="no pgflow engine"):
        asyncio.run(main())
    nowhere = "postgresql://nobody@127.0.0.1:1/x?connect_timeout=1"
    quick = WorkerSettings(connect_timeout=0.3)
    with pytest.raises(errors.DatabaseError, match="cannot connect"):
        asyncio.run(
            Worker(
                QUEUED, step_slug="double", handler=double, database_url=nowhere, settings=quick
            ).start()
        )


def test_a_worker_runs_once(db_url: str) -> None:
    async def main() -> None:
        worker = Worker(QUEUED, step_slug="double", handler=double, database_url=db_url)
        async with worker:
            with pytest.raises(RuntimeError, match="started already"):
                await worker.start()

    asyncio.run(main())

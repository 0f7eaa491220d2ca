"""An asyncio service that runs every step worker of communityThreadsV1 in its own event loop
(instead of one process per step), starts two runs, prints their outcome, and stops.

Run it from examples/community_threads after `pgflow-gen db migrate`: `python -m app.service`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from app import handlers
from app.pgflow.community_threads_v1 import STEP_QUEUED_FLOW, Input
from pgflow_gen.runtime import Client, Worker

WORKERS = [
    Worker(STEP_QUEUED_FLOW, step_slug="classify", handler=handlers.classify),
    Worker(STEP_QUEUED_FLOW, step_slug="deliverSlack", handler=handlers.deliver_slack),
    Worker(STEP_QUEUED_FLOW, step_slug="listHelpers", handler=handlers.list_helpers),
    Worker(STEP_QUEUED_FLOW, step_slug="thankHelpers", handler=handlers.thank_helper),
]


async def main() -> None:
    async with contextlib.AsyncExitStack() as stack:
        for worker in WORKERS:
            await stack.enter_async_context(worker)  # compiles, registers, polls
        client = Client()
        for text in ("Can someone help me?", "BUY NOW"):
            run_input = Input(thread_id="t1", text=text)
            run = await asyncio.to_thread(client.start_flow, STEP_QUEUED_FLOW, run_input)
            finished = await asyncio.to_thread(run.wait, 30)
            print(f"{text}: {finished.status} {finished.output}")
    # Leaving the block drained and stopped every worker.


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(main())

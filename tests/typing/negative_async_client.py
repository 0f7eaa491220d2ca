"""Mistakes the generated types must catch through the AsyncClient as through the Client. Each
marked line MUST be an error for mypy (the ignore's code; the run uses --warn-unused-ignores)
and for pyright (tests/golden/test_pyright.py runs it with ignore comments off and expects
exactly the marked lines). Checked against examples/plain_flow; never executed."""

from __future__ import annotations

import psycopg
from app.pgflow.greet_user import FLOW, Input, Output

from pgflow_gen.runtime import AsyncClient, AsyncRun, Run


async def never_called(client: AsyncClient, app: psycopg.AsyncConnection[object]) -> None:
    good: Input = {"first": "Ada", "last": "Lovelace"}
    run = await client.start_flow(FLOW, good, connection=app)
    done: AsyncRun[Output] = await run.wait(timeout=30)
    if done.output is not None:
        greeting: str = done.output["greeting"]
        count: int = done.output["greeting"]  # type: ignore[assignment]
        print(greeting, count)
        print(done.output["nope"])  # type: ignore[typeddict-item]
    bad: Input = {"first": "Ada", "last": 1}  # type: ignore[typeddict-item]
    await client.start_flow(FLOW, good, idempotency_key=7)  # type: ignore[call-overload]
    await client.start_flow(FLOW, good, connection=psycopg.connect())  # type: ignore[call-overload]
    sync_run: Run[Output] = await client.start_flow(FLOW, good)  # type: ignore[assignment]
    await client.pause_step(FLOW, "fullname")  # type: ignore[misc]
    await client.start_flows(FLOW, [good, bad], idempotency_keys=[1])  # type: ignore[list-item]
    print(client.get_run(run.run_id).status, sync_run)  # type: ignore[attr-defined]

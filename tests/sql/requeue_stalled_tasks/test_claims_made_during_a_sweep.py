"""A claim made while a requeue_stalled_tasks() call runs is not taken by it.

The interleaving, with three connections: a silent worker W1 holds task T; a sweep starts (its
first statement's snapshot predates everything below) and is held up while it checks workers;
meanwhile W1's fail_task returns T to queued, and W2 registers and claims it (attempt 2); then the
sweep goes on. The sweep is held up at a gate: a row-level security policy on pgflow.workers, for
the sweep's role only, that waits for an advisory lock the test holds. (The sweep's functions run
as their caller in this test's database: as the engine's owner, which they are from engine 0019,
they would pass the gate.)
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql

from tests.engine import WORKER_ID, Engine

GATE_LOCK = 4242
W2 = uuid.UUID("00000000-0000-0000-0000-0000000000b2")
DEADLINE_S = 30.0

GATE_SETUP = """
create role {role} nologin;
grant usage on schema pgflow, pgmq to {role};
grant all on all tables in schema pgflow, pgmq to {role};
grant all on all sequences in schema pgflow, pgmq to {role};
grant execute on all functions in schema pgflow to {role};
alter function pgflow.requeue_stalled_tasks() security invoker;
alter function pgflow.find_stalled_tasks() security invoker;
create function public.pass_the_gate() returns boolean language plpgsql volatile
  cost 0.0001 as $$
begin
  perform pg_advisory_lock_shared({lock});
  perform pg_advisory_unlock_shared({lock});
  return true;
end;
$$;
alter table pgflow.workers enable row level security;
create policy held_at_the_gate on pgflow.workers for all to {role}
  using (public.pass_the_gate());
"""


def test_a_task_claimed_by_a_worker_registered_during_the_sweep_stays_claimed(
    engine: Engine, db_url: str
) -> None:
    engine.flow("race", {"slug": "work"}, max_attempts=3)
    run_id = engine.start("race")
    [first] = engine.poll("race")  # W1 (the engine helper's worker) claims T
    # ... and goes silent (a heartbeat a minute old): T is stalled.
    engine.conn.execute(
        "update pgflow.workers set last_heartbeat_at = now() - interval '1 minute'"
        " where worker_id = %s",
        (WORKER_ID,),
    )
    role = f"pgflow_test_sweeper_{uuid.uuid4().hex[:8]}"  # roles belong to the whole server
    engine.conn.execute(GATE_SETUP.format(role=role, lock=GATE_LOCK).encode())
    engine.conn.execute("select pg_advisory_lock(%s)", (GATE_LOCK,))

    swept: list[Any] = []

    def sweep() -> None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(sql.SQL("set role {}").format(sql.Identifier(role)))
            try:
                swept.append(conn.execute("select pgflow.requeue_stalled_tasks()").fetchone())
            except psycopg.Error as exc:  # asserted below
                swept.append(exc)

    sweeper = threading.Thread(target=sweep)
    sweeper.start()
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not engine.value(
            "select exists (select 1 from pg_stat_activity"
            " where wait_event = 'advisory' and query like '%%requeue_stalled_tasks%%')"
        ):
            assert time.monotonic() < deadline, f"the sweep never reached the gate: {swept}"
            time.sleep(0.01)
        engine.fail(first, fenced=True)  # W1's late failure: T is queued again
        engine.conn.execute("select pgflow.register_worker(%s, 'race', 'w2')", (W2,))
        [again] = engine.call(
            "claim_tasks", "race", [first.msg_id], W2, "race"
        )  # W2 claims T: attempt 2
        assert again["attempt"] == 2
    finally:
        engine.conn.execute("select pg_advisory_unlock(%s)", (GATE_LOCK,))
        sweeper.join(DEADLINE_S)
        engine.conn.execute(
            sql.SQL("drop owned by {0}; drop role {0}").format(sql.Identifier(role))
        )
    assert swept == [(0,)]
    task = engine.task(run_id, "work")
    assert (task["status"], task["attempts_count"], task["requeued_count"]) == ("started", 2, 0)
    assert task["last_worker_id"] == W2

"""The engine's periodic maintenance against its history: the stall rule, the signal sweep and the
tasks finished lately, timed on the previous engine and the latest one side by side on one server.

    .venv/bin/python benchmarks/maintenance.py [--history 1000000] [--in-flight 10000]
        [--against 0024] [--repeat 20] [--durable]

Each engine version (`--against`, and the latest) gets two fresh databases:

1. **history**: HISTORY finished runs of `engine_throughput.py`'s 3-step chain and HISTORY / 10
   finished runs of a flow whose one step waits for a signal (written set-based, as if they had
   run a day ago, their tasks' messages in the queue's archive as engines before 0025 left
   them), and in flight 100 runs of the chain whose first task a worker holds and 100
   runs waiting for their signal.
2. **in flight**: IN_FLIGHT runs of the chain under way, each with its first task held, and
   IN_FLIGHT waiting for a signal, and no history.

On each, alternating versions, REPEAT times: the stall rule (`select count(*) from
pgflow.find_stalled_tasks()`, which the workers' sweep runs every 15 s and `/metrics` on each
scrape), the signal sweep (`pgflow._expire_signal_steps()`, which the same sweep runs; in a
transaction rolled back) and the tasks finished in the last hour (`pgflow.finished_tasks()`,
which the dashboard's overview and `/metrics` read). Prints the median and every repeat in ms,
as the client sees them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from benchmarks import engine_throughput as et
from pgflow_gen.runtime import migrations

SIGNAL_FLOW = "benchWait"
HISTORY_IN_FLIGHT = 100


@contextmanager
def database(admin: str, target: str | None) -> Iterator[psycopg.Connection[Any]]:
    """A fresh database on engine `target` (None: the latest) with the chain (its worker
    registered) and the signal flow."""
    with et.fresh_database(admin) as url, psycopg.connect(url, autocommit=True) as conn:
        migrations.migrate(conn, target=target)
        et.define_chain(conn, 1, False)
        conn.execute("select pgflow.create_flow(%s)", (SIGNAL_FLOW,))
        conn.execute(
            "select pgflow.add_step(%s, 'approval', step_type => 'signal', timeout => 604800)",
            (SIGNAL_FLOW,),
        )
        yield conn


def write_history(conn: psycopg.Connection[Any], flow: str, runs: int) -> None:
    """`runs` finished runs of `flow`, completed a day ago, with their steps and tasks (none
    for a signal step), and the tasks' messages archived (ids below zero, clear of the queue's)."""
    conn.execute(
        "insert into pgflow.runs (run_id, flow_slug, status, input, output, remaining_steps,"
        "  started_at, completed_at)"
        " select gen_random_uuid(), %(flow)s, 'completed', jsonb_build_object('i', i), '{}', 0,"
        "  now() - interval '1 day', now() - interval '1 day'"
        " from generate_series(1, %(runs)s) as i",
        {"flow": flow, "runs": runs},
    )
    conn.execute(
        "insert into pgflow.step_states (run_id, flow_slug, step_slug, status, output,"
        "  remaining_deps, remaining_tasks, initial_tasks, created_at, started_at, completed_at)"
        " select r.run_id, r.flow_slug, s.step_slug, 'completed', '1', 0, 0, 1,"
        "  r.started_at, r.started_at, r.completed_at"
        " from pgflow.runs as r join pgflow.steps as s on s.flow_slug = r.flow_slug"
        " where r.flow_slug = %(flow)s and r.status = 'completed'",
        {"flow": flow},
    )
    conn.execute(
        "insert into pgflow.step_tasks (run_id, flow_slug, step_slug, task_index, status,"
        "  attempts_count, message_id, queue_name, output, queued_at, started_at, completed_at)"
        " select ss.run_id, ss.flow_slug, ss.step_slug, 0, 'completed', 1,"
        "  -row_number() over (), s.queue_name,"
        "  '1', ss.started_at, ss.started_at, ss.completed_at"
        " from pgflow.step_states as ss"
        " join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug"
        " where ss.flow_slug = %(flow)s and s.step_type <> 'signal'",
        {"flow": flow},
    )
    for (queue,) in conn.execute(
        "select distinct queue_name from pgflow.steps"
        " where flow_slug = %s and step_type <> 'signal'",
        (flow,),
    ).fetchall():
        conn.execute(
            f"insert into pgmq.a_{queue} (msg_id, read_ct, enqueued_at, archived_at, vt, message)"
            " select t.message_id, 1, t.queued_at, t.completed_at, t.completed_at,"
            "  jsonb_build_object('flow_slug', t.flow_slug, 'run_id', t.run_id,"
            "   'step_slug', t.step_slug, 'task_index', 0)"
            " from pgflow.step_tasks as t where t.queue_name = %s and t.message_id < 0",
            (queue,),
        )


def put_in_flight(conn: psycopg.Connection[Any], runs: int) -> None:
    """`runs` runs of the chain with their first task held by the chain's worker, and as many
    runs waiting for a signal."""
    worker = conn.execute("select worker_id, queue_name from pgflow.workers").fetchone()
    assert worker is not None
    for flow, inputs in ((et.FLOW, "jsonb_build_object('i', i)"), (SIGNAL_FLOW, "'{}'::jsonb")):
        conn.execute(
            "select count(*) from pgflow.start_flows(%s, (select array_agg(" + inputs + ")"
            " from generate_series(1, %s) as i))",
            (flow, runs),
        )
    claimed = 0
    while claimed < runs:
        rows = conn.execute(
            "select * from pgflow.read_and_claim(%s, %s, %s, 1000, 3600, null)",
            (et.FLOW, worker[1], worker[0]),
        ).fetchall()
        assert rows, f"claimed {claimed} of {runs}"
        claimed += len(rows)


def timed(conn: psycopg.Connection[Any], statement: str, rollback: bool = False) -> float:
    started = time.perf_counter()
    if rollback:
        with conn.transaction(force_rollback=True):
            conn.execute(statement).fetchall()
    else:
        conn.execute(statement).fetchall()
    return 1000 * (time.perf_counter() - started)


CHECKS: dict[str, Callable[[psycopg.Connection[Any]], float]] = {
    "stall rule": lambda conn: timed(conn, "select count(*) from pgflow.find_stalled_tasks()"),
    "signal sweep": lambda conn: timed(conn, "select pgflow._expire_signal_steps()", True),
    "finished lately": lambda conn: timed(conn, "select count(*) from pgflow.finished_tasks()"),
}


def compare(
    admin: str, against: str, repeat: int, prepare: Callable[[psycopg.Connection[Any]], None]
) -> dict[str, dict[str, list[float]]]:
    """Each check's times (ms) per version, alternating versions call by call."""
    times: dict[str, dict[str, list[float]]] = {
        check: {against: [], "latest": []} for check in CHECKS
    }
    with database(admin, against) as before, database(admin, None) as after:
        for conn in (before, after):
            prepare(conn)
            conn.execute("vacuum analyze")
        for check, run in CHECKS.items():
            run(before), run(after)  # warm both caches first
            for _ in range(repeat):
                times[check][against].append(run(before))
                times[check]["latest"].append(run(after))
    return times


def report(title: str, times: dict[str, dict[str, list[float]]]) -> None:
    print(title, flush=True)
    for check, versions in times.items():
        for version, values in versions.items():
            print(
                f"  {check}, engine {version}: median {statistics.median(values):.2f} ms"
                f" (every repeat: {', '.join(f'{v:.2f}' for v in values)})",
                flush=True,
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--history", type=int, default=1_000_000)
    parser.add_argument("--in-flight", type=int, default=10_000)
    parser.add_argument("--against", default="0024")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument(
        "--durable", action="store_true", help="the server's durable defaults (fsync on)"
    )
    args = parser.parse_args(argv)
    print("durable (server defaults)" if args.durable else "fast settings", flush=True)

    def with_history(conn: psycopg.Connection[Any]) -> None:
        started = time.perf_counter()
        write_history(conn, et.FLOW, args.history)
        write_history(conn, SIGNAL_FLOW, args.history // 10)
        put_in_flight(conn, HISTORY_IN_FLIGHT)
        print(f"  (history written in {time.perf_counter() - started:.0f} s)", flush=True)

    with et.server(args.durable) as admin:
        report(
            f"history: {args.history:,} finished runs of the chain, {args.history // 10:,} of"
            f" the signal flow; {HISTORY_IN_FLIGHT} of each in flight",
            compare(admin, args.against, args.repeat, with_history),
        )
        report(
            f"in flight: {args.in_flight:,} runs of the chain each with a task held,"
            f" {args.in_flight:,} waiting for a signal; no history",
            compare(
                admin, args.against, args.repeat, lambda conn: put_in_flight(conn, args.in_flight)
            ),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Engine throughput next to raw PGMQ, measured in the same run on the same server.

Raw PGMQ loop: send a batch, read it, archive it. Engine loops, for RUNS runs of a 3-step
sequential flow started beforehand (3 * RUNS tasks), each claiming at most a batch at a time:

- `two calls`: pgmq.read, then claim_tasks (the worker's poll before engine 0012);
- `read_and_claim`: one read_and_claim call (the poll of workers since 0012);

each followed by one completion call for what it claimed (complete_task for a single task, as a
worker sends a lone result; complete_tasks for several, as it sends results that finished
together); and

- `complete_and_claim`: the batch's completion and the next claim in one call (engine 0014,
  what a busy worker sends when it has results and free slots at once).

Every call is its own autocommit transaction, as a real worker's. With `--clients 3`, three
processes run each loop at once: raw PGMQ with one queue each; the engine as three workers on
the flow's one queue (`flow queue`), and as one worker per step of a step-queued copy of the
flow (`step queues`). Prints tasks/s, msg/s, their ratio per repeat and its median, and the
server CPU time per task (the client backends' CPU, read from /proc when the server is local).
With `--pgflow`, pgflow 0.8.1's own engine on the same chain too, in each repeat (its workers on
its one flow queue: pgmq.read, its start_tasks, then complete_task once per task, as its worker
does; `pgflow_reference.py`), and our best loop as a multiple of it.

    .venv/bin/python benchmarks/engine_throughput.py [--runs 2000] [--repeat 3]
        [--batch 1 10 50] [--clients 1 3] [--durable] [--limits] [--keyed] [--pgflow]
        [--only read_and_claim ...]

Uses a fresh embedded PostgreSQL with fsync, synchronous_commit and full_page_writes off (the
settings of the anchor figures), with `--durable` the server's defaults, or
PGFLOW_BENCH_DATABASE_URL (a role that may create databases).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import Jsonb

from benchmarks import output_check, pgflow_reference
from pgflow_gen.runtime import embedded, migrations

FLOW = "benchChain"
STEPS = ("one", "two", "three")
OUTPUT = {"ok": True}
#: `--limits`: a cap on every step that no run of this benchmark reaches.
UNREACHED_CAP = 100_000
#: Engine loops by name, in the order they are printed.
ENGINE_LOOPS = ("two_calls", "read_and_claim", "complete_and_claim")


@contextmanager
def server(durable: bool = False) -> Iterator[str]:
    """A fresh embedded server: fast settings (fsync, synchronous_commit and full_page_writes
    off), or with `durable` the server defaults; or PGFLOW_BENCH_DATABASE_URL as it is."""
    external = os.environ.get("PGFLOW_BENCH_DATABASE_URL")
    if external:
        yield external
        return
    base = Path(tempfile.mkdtemp(prefix="pgflow-bench-"))
    instance = embedded.EmbeddedServer(
        base, embedded.default_bin_dir(), fast=not durable, local=False
    )
    try:
        yield instance.ensure_started()
    finally:
        instance.destroy()


@contextmanager
def fresh_database(admin_url: str) -> Iterator[str]:
    name = f"pgflow_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    params = conninfo_to_dict(admin_url)
    params["dbname"] = name
    try:
        yield make_conninfo("", **params)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("drop database {} with (force)").format(sql.Identifier(name)))


@dataclass(frozen=True)
class Result:
    """Items (messages or tasks) per second, the server's CPU time per item in us (None when
    the server's processes cannot be read from here), and the WAL written per item in bytes."""

    rate: float
    server_us: float | None
    wal_bytes: float = 0.0


def backend_cpu(conn: psycopg.Connection[Any]) -> float | None:
    """CPU seconds the connection's server process has used (None: not a local process)."""
    try:
        return process_cpu(conn.info.backend_pid)
    except OSError:
        return None


def process_cpu(pid: int) -> float:
    """CPU seconds (user and system) a local process has used; OSError when it is not there."""
    fields = _proc_stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_cpu(conn: psycopg.Connection[Any]) -> float | None:
    """CPU seconds the whole server has used so far (None: not a local server): the
    postmaster, every process it has now (backends, WAL writer, checkpointer, autovacuum), and
    the processes that ended since it started (the kernel adds them to the postmaster's children
    times once they are reaped). The difference of two readings is the server's CPU in between."""
    try:
        backend = _proc_stat(conn.info.backend_pid)
        postmaster = int(backend[1])
        total = sum(int(field) for field in _proc_stat(postmaster)[11:15])
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = _proc_stat(int(entry.name))
            except OSError:
                continue  # ended while we looked: its time is the postmaster's children's now
            if int(fields[1]) == postmaster:
                total += int(fields[11]) + int(fields[12])
    except OSError:
        return None
    return total / os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (fields[1] is the parent's pid,
    fields[11:15] utime, stime, cutime and cstime in clock ticks)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def in_parallel(url: str, loops: Sequence[Callable[[psycopg.Connection[Any]], int]]) -> Result:
    """Run each loop in a process of its own on its own connection, all released at once;
    items per second from the release until the last one ends."""
    with psycopg.connect(url, autocommit=True) as conn:
        wal_before = _wal_position(conn)
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(len(loops) + 1)
    done = context.Queue()
    processes = [
        context.Process(target=_client, args=(url, loop, barrier, done), daemon=True)
        for loop in loops
    ]
    for process in processes:
        process.start()
    barrier.wait(timeout=60)
    started = time.perf_counter()
    results = [done.get(timeout=600) for _ in processes]
    elapsed = time.perf_counter() - started
    for process in processes:
        process.join(timeout=60)
        if process.exitcode != 0:
            raise RuntimeError(f"a benchmark client exited with {process.exitcode}")
    failures = [r for r in results if isinstance(r, str)]
    if failures:
        raise RuntimeError(failures[0])
    items = sum(r[0] for r in results)
    cpus = [r[1] for r in results]
    server_us = None if None in cpus else 1e6 * sum(cpus) / items
    with psycopg.connect(url, autocommit=True) as conn:
        wal = _wal_position(conn) - wal_before
    return Result(items / elapsed, server_us, wal / items)


def _wal_position(conn: psycopg.Connection[Any]) -> int:
    """Bytes of WAL the server has written so far (every database's)."""
    row = conn.execute("select pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
    return int(row[0]) if row else 0


def _client(
    url: str,
    loop: Callable[[psycopg.Connection[Any]], int],
    barrier: Any,
    done: Any,
) -> None:
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            barrier.wait(timeout=60)
            before = backend_cpu(conn)
            items = loop(conn)
            after = backend_cpu(conn)
            cpu = None if before is None or after is None else after - before
            done.put((items, cpu))
    except Exception as exc:  # reported by the parent, which then fails the measurement
        done.put(f"{type(exc).__name__}: {exc}")


# Raw PGMQ


def raw_pgmq(url: str, total: int, batch: int, clients: int = 1) -> Result:
    """send + read + archive in batches of `batch`, `total` messages per client, one queue
    per client."""
    with psycopg.connect(url, autocommit=True) as conn:
        migrations.ensure_pgmq(conn)
        for index in range(clients):
            conn.execute("select pgmq.create(%s)", (f"raw{index}",))
    loops = [_raw_loop(f"raw{index}", total, batch) for index in range(clients)]
    return in_parallel(url, loops)


def _raw_loop(queue: str, total: int, batch: int) -> Callable[[psycopg.Connection[Any]], int]:
    payload = [
        Jsonb({"flow_slug": FLOW, "run_id": str(uuid.uuid4()), "step_slug": "s", "task_index": 0})
    ] * batch

    def loop(conn: psycopg.Connection[Any]) -> int:
        done = 0
        while done < total:
            conn.execute("select pgmq.send_batch(%s, %s::jsonb[])", (queue, payload))
            ids = [
                r[0]
                for r in conn.execute("select msg_id from pgmq.read(%s, 30, %s)", (queue, batch))
            ]
            conn.execute("select pgmq.archive(%s, %s::bigint[])", (queue, ids))
            done += len(ids)
        return done

    return loop


# The engine


@dataclass(frozen=True)
class Route:
    """What one engine client claims from: its queue, and the step in a step-queued flow."""

    queue: str
    step: str | None
    worker_id: uuid.UUID


def engine(
    url: str,
    runs: int,
    batch: int,
    loop: str,
    clients: int = 1,
    step_queues: bool = False,
    limits: bool = False,
    keyed: bool = False,
) -> tuple[Result, float]:
    """(tasks per second of `loop`, runs started per second) for `runs` runs of the chain,
    with `clients` workers on the flow's queue, or one per step with `step_queues`; with
    `limits`, every step has a cap it never reaches (what a limited step's claims cost); with
    `keyed`, every step has a concurrency key whose limit no run reaches (engine 0018: what a
    keyed step's tasks cost, parked and given their messages when the start commits)."""
    with psycopg.connect(url, autocommit=True) as conn:
        migrations.migrate(conn)
        routes = define_chain(conn, clients, step_queues)
        for step in STEPS if limits else ():
            conn.execute(
                "select pgflow.set_step_limits(%s, %s, max_in_flight => %s)",
                (FLOW, step, UNREACHED_CAP),
            )
        if keyed:
            key_every_step(conn)
        started = time.perf_counter()
        for i in range(runs):
            conn.execute("select pgflow.start_flow(%s, %s)", (FLOW, Jsonb({"i": i})))
        start_rate = runs / (time.perf_counter() - started)
    result = in_parallel(url, [engine_loop(loop, route, batch) for route in routes])
    _assert_completed(url, runs)
    return result, start_rate


def _assert_completed(url: str, runs: int) -> None:
    """Every one of the `runs` runs completed (either engine's runs table)."""
    with psycopg.connect(url, autocommit=True) as conn:
        completed = conn.execute(
            "select count(*) from pgflow.runs where status = 'completed'"
        ).fetchone()
    assert completed == (runs,), f"only {completed} of {runs} runs completed"


def define_chain(conn: psycopg.Connection[Any], clients: int, step_queues: bool) -> list[Route]:
    """The 3-step chain, in queue mode flow (`clients` workers on its queue) or step (one
    worker per step); registers the workers and returns their routes."""
    if step_queues:
        shape = {
            "steps": [
                {
                    "slug": step,
                    "stepType": "single",
                    "dependencies": [STEPS[index - 1]] if index else [],
                    "whenUnmet": "skip",
                    "whenExhausted": "fail",
                    "requiredInputPattern": {"defined": False},
                    "forbiddenInputPattern": {"defined": False},
                }
                for index, step in enumerate(STEPS)
            ]
        }
        routes = [Route(f"{FLOW.lower()}__{step}", step, uuid.uuid4()) for step in STEPS]
        route_map = [{"stepSlug": r.step, "queueName": r.queue} for r in routes]
        conn.execute(
            "select pgflow.ensure_flow_compiled(%s, %s, 'step', %s)",
            (FLOW, Jsonb(shape), Jsonb(route_map)),
        )
    else:
        conn.execute("select pgflow.create_flow(%s)", (FLOW,))
        previous: list[str] = []
        for step in STEPS:
            conn.execute("select pgflow.add_step(%s, %s, %s)", (FLOW, step, previous))
            previous = [step]
        routes = [Route(FLOW.lower(), None, uuid.uuid4()) for _ in range(clients)]
    for route in routes:
        conn.execute(
            "select pgflow.register_worker(%s, %s, 'bench', %s, %s)",
            (route.worker_id, route.queue, FLOW, route.step),
        )
    return routes


def key_every_step(conn: psycopg.Connection[Any]) -> None:
    """Every step of the chain keyed by its run (`$.i`) with a limit no run reaches, as a spec's
    `concurrency: {key: $.i, max_in_flight: 100000}` would set."""
    conn.execute(
        "update pgflow.steps set opt_concurrency_key = '$.i', opt_concurrency_limit = %s"
        " where flow_slug = %s",
        (UNREACHED_CAP, FLOW),
    )


CLAIMED = "select run_id, step_slug, task_index, attempt from "


def engine_loop(
    name: str,
    route: Route,
    batch: int,
    claim_times: list[float] | None = None,
    finished: Callable[[psycopg.Connection[Any]], bool] | None = None,
) -> Callable[[psycopg.Connection[Any]], int]:
    """The engine loop `name` of one client; `claim_times` collects each read_and_claim
    call's seconds; `finished` says when a claim that found nothing means the end (default:
    no run is started any more)."""
    done_yet = finished or _all_runs_finished
    selector = (FLOW, route.queue, route.worker_id)

    def read_and_claim(conn: psycopg.Connection[Any]) -> list[Any]:
        started = time.perf_counter()
        tasks = conn.execute(
            CLAIMED + "pgflow.read_and_claim(%s, %s, %s, %s, 30, %s)",
            (*selector, batch, route.step),
        ).fetchall()
        if claim_times is not None:
            claim_times.append(time.perf_counter() - started)
        return tasks

    def two_calls(conn: psycopg.Connection[Any]) -> list[Any]:
        ids = [
            r[0]
            for r in conn.execute("select msg_id from pgmq.read(%s, 30, %s)", (route.queue, batch))
        ]
        return conn.execute(
            CLAIMED + "pgflow.claim_tasks(%s, %s, %s, %s, %s)",
            (FLOW, ids, route.worker_id, route.queue, route.step),
        ).fetchall()

    def complete_and_claim(conn: psycopg.Connection[Any], tasks: list[Any]) -> list[Any]:
        return conn.execute(
            CLAIMED + "pgflow.complete_and_claim(%s, %s, %s, %s, 30, %s, %s, %s, %s,"
            " %s::jsonb[], %s::int[])",
            (*selector, batch, route.step, *_columns(tasks)),
        ).fetchall()

    def loop(conn: psycopg.Connection[Any]) -> int:
        claim = two_calls if name == "two_calls" else read_and_claim
        done = 0
        tasks = claim(conn)
        while True:
            if not tasks:
                if done_yet(conn):
                    return done
                tasks = claim(conn)
                continue
            done += len(tasks)
            if name == "complete_and_claim":
                tasks = complete_and_claim(conn, tasks)
            else:
                complete(conn, tasks)
                tasks = claim(conn)

    return loop


def _columns(tasks: list[Any]) -> tuple[list[Any], ...]:
    """The completion's arrays for claimed (run_id, step_slug, task_index, attempt) rows."""
    return (
        [task[0] for task in tasks],
        [task[1] for task in tasks],
        [task[2] for task in tasks],
        [Jsonb(OUTPUT)] * len(tasks),
        [task[3] for task in tasks],
    )


def complete(conn: psycopg.Connection[Any], tasks: list[Any]) -> None:
    """Complete claimed (run_id, step_slug, task_index, attempt) rows as a worker reports
    them: complete_task for one, one complete_tasks call for several."""
    if len(tasks) == 1:
        run_id, step_slug, task_index, attempt = tasks[0]
        conn.execute(
            "select 1 from pgflow.complete_task(%s, %s, %s, %s, %s)",
            (run_id, step_slug, task_index, Jsonb(OUTPUT), attempt),
        )
        return
    conn.execute(
        "select 1 from pgflow.complete_tasks(%s, %s, %s, %s::jsonb[], %s::int[])",
        _columns(tasks),
    )


def pgflow_engine(url: str, runs: int, batch: int, clients: int) -> Result:
    """Tasks per second of pgflow's own engine (`pgflow_reference.py`) on the same chain:
    `runs` runs started with its start_flow, then `clients` workers on its one flow queue,
    each reading a batch, starting its tasks and completing them one call per task."""
    with psycopg.connect(url, autocommit=True) as conn:
        pgflow_reference.install(conn)
        pgflow_reference.define_chain(conn, FLOW, STEPS)
        workers = [uuid.uuid4() for _ in range(clients)]
        for worker_id in workers:
            pgflow_reference.register_worker(conn, worker_id, FLOW)
        for i in range(runs):
            conn.execute("select pgflow.start_flow(%s, %s)", (FLOW, Jsonb({"i": i})))

    def loop_of(worker_id: uuid.UUID) -> Callable[[psycopg.Connection[Any]], int]:
        def loop(conn: psycopg.Connection[Any]) -> int:
            done = 0
            while (did := pgflow_reference.run_tasks(conn, FLOW, worker_id, batch)) or (
                not _all_runs_finished(conn)
            ):
                done += did
            return done

        return loop

    result = in_parallel(url, [loop_of(worker_id) for worker_id in workers])
    _assert_completed(url, runs)
    return result


def _all_runs_finished(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("select count(*) from pgflow.runs where status = 'started'").fetchone()
    return row == (0,)


# The report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--runs", type=int, default=2000, help="runs of the 3-step flow (default 2000)"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="measurements per figure; the median is shown"
    )
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument(
        "--clients",
        type=int,
        nargs="+",
        default=[1],
        help="clients per measurement (3: also one worker per step queue)",
    )
    parser.add_argument("--only", nargs="+", choices=ENGINE_LOOPS, default=list(ENGINE_LOOPS))
    parser.add_argument(
        "--durable", action="store_true", help="the server's durable defaults (fsync on)"
    )
    parser.add_argument(
        "--limits",
        action="store_true",
        help="give every step a max_in_flight it never reaches: what limited claims cost",
    )
    parser.add_argument(
        "--pgflow",
        action="store_true",
        help="also pgflow 0.8.1's own engine on the same chain (its one flow queue)",
    )
    parser.add_argument(
        "--keyed",
        action="store_true",
        help="give every step a concurrency key (one per run) whose limit is never reached",
    )
    args = parser.parse_args(argv)

    with server(args.durable) as admin_url:
        with psycopg.connect(admin_url) as conn:
            version = conn.execute("show server_version").fetchone()
        print(
            f"PostgreSQL {version[0] if version else '?'}, PGMQ {migrations.pgmq_sql()[1]}, "
            f"{args.runs} runs x 3 steps, median of {args.repeat},"
            f" {'durable (server defaults)' if args.durable else 'fast settings'}"
            f"{', every step capped (never reached)' if args.limits else ''}"
            f"{', every step keyed (limit never reached)' if args.keyed else ''}",
            flush=True,
        )
        task_us = 0.0
        for clients in args.clients:
            for batch in args.batch:
                task_us = measure(admin_url, args, clients, batch) or task_us
    # What the worker's output check adds, next to the engine's time per task (last figure).
    for line in output_check.lines(task_us):
        print(line, flush=True)
    return 0


def measure(admin_url: str, args: argparse.Namespace, clients: int, batch: int) -> float:
    """Print one batch size and client count; the engine's wall time per task (us) of the
    first engine loop measured."""
    layouts = [("flow queue", False)] + ([("step queues", True)] if clients == len(STEPS) else [])
    raw: list[Result] = []
    figures: dict[tuple[str, str], list[Result]] = {}
    starts: list[float] = []
    pgflow: list[Result] = []
    for _ in range(args.repeat):
        with fresh_database(admin_url) as url:
            raw.append(raw_pgmq(url, 3 * args.runs // clients, batch, clients))
        for layout, step_queues in layouts:
            for loop in args.only:
                with fresh_database(admin_url) as url:
                    result, start_rate = engine(
                        url,
                        args.runs,
                        batch,
                        loop,
                        clients,
                        step_queues,
                        args.limits,
                        args.keyed,
                    )
                figures.setdefault((layout, loop), []).append(result)
                starts.append(start_rate)
        if args.pgflow:
            with fresh_database(admin_url) as url:
                pgflow.append(pgflow_engine(url, args.runs, batch, clients))
    raw_rate = statistics.median(r.rate for r in raw)
    print(
        f"batch {batch}, {clients} client(s): raw PGMQ {raw_rate:,.0f} msg/s{_server(raw)};"
        f" per repeat {', '.join(f'{r.rate:,.0f}' for r in raw)};"
        f" start_flow {statistics.median(starts):,.0f} runs/s",
        flush=True,
    )
    for (layout, loop), results in figures.items():
        ratios = [e.rate / r.rate for e, r in zip(results, raw, strict=True)]
        print(
            f"  {layout if clients > 1 else '':>11} {loop:<18} "
            f"{statistics.median(e.rate for e in results):>8,.0f} tasks/s{_server(results)},"
            f" {statistics.median(ratios):6.1%} of raw; per repeat "
            + ", ".join(f"{x:.1%}" for x in ratios),
            flush=True,
        )
    if pgflow:
        ratios = [e.rate / r.rate for e, r in zip(pgflow, raw, strict=True)]
        ours = [
            max(results[i].rate for results in figures.values()) / e.rate
            for i, e in enumerate(pgflow)
        ]
        print(
            f"  {'pgflow 0.8.1 (one queue)':<30} "
            f"{statistics.median(e.rate for e in pgflow):>8,.0f} tasks/s{_server(pgflow)},"
            f" {statistics.median(ratios):6.1%} of raw; per repeat "
            + ", ".join(f"{x:.1%}" for x in ratios)
            + f"; our best loop {statistics.median(ours):.1f}x pgflow, per repeat "
            + ", ".join(f"{x:.1f}x" for x in ours),
            flush=True,
        )
    first = next(iter(figures.values()))
    return 1e6 / statistics.median(e.rate for e in first)


def _server(results: list[Result]) -> str:
    cpu = [r.server_us for r in results if r.server_us is not None]
    wal = statistics.median(r.wal_bytes for r in results)
    if not cpu:
        return f" ({wal:,.0f} B WAL each)"
    return f" ({statistics.median(cpu):,.0f} us server CPU, {wal:,.0f} B WAL each)"


if __name__ == "__main__":
    sys.exit(main())

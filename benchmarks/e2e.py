"""End-to-end benchmarks: real worker processes from generated entry files, next to raw PGMQ.

    .venv/bin/python benchmarks/e2e.py [--runs 1500] [--durable] [--py-spy DIR]
        [--only throughput latency steady isolation idle retry]

1. throughput: a 3-step sequential step-queued flow (`benchChain`), one worker process per step;
   RUNS runs become visible at once; tasks/s until the last run completes. Raw PGMQ in the same
   run: send + read + archive in batches of 10, by 1 client and by 3 clients (one queue each).
   Where the CPU goes, per task and per raw message: the clients' (worker processes, from /proc;
   raw clients, from their resource usage) and the whole server's (every server process,
   including those that ended, from /proc). With `--py-spy DIR`, py-spy samples each worker's
   stacks meanwhile into DIR/<module>.txt (collapsed stacks; it costs CPU, so take the rates
   from a run without it).
2. latency: runs started one every 20 ms; the handoff from a step's completion to the claim of its
   dependent (the moment before its handler starts), from the engine's own timestamps.
   steady: steady traffic on the same flow, runs started one by one (one start_flow call and
   transaction each): first as fast as one client can for STEADY_S seconds (the saturation
   rate), then at half the rate that phase completed runs at; for each, completed tasks/s, the
   handoff p50/p95/p99 and the workers' CPU time per task (from /proc).
3. isolation: p95 of a fast step's latency (run start to step completion) while a slow step
   (50 ms per task, 10 at a time) has a 500-task backlog, in queue mode step (`isoSteps`, a worker
   process per step) and flow mode (`isoFlow`, one worker process for both), next to its idle p95.
4. idle: CPU and transactions per second of one idle worker over 20 s.
5. retry: how late a retry starts after its delay ends: 50 runs of `benchRetry`, one every 100 ms,
   whose task fails its first attempt (base_delay 1: the retry is due 2 s later); the lateness
   is the retry's start minus the failure's time minus 2 s, both from the worker's clock.

Uses a fresh embedded PostgreSQL (fsync, synchronous_commit and full_page_writes off; with
`--durable` the server's defaults), a fresh database per measurement, or
PGFLOW_BENCH_DATABASE_URL. `--linger-ms N` sets the reporter's linger (REPORT_LINGER_S in
`pgflow_gen/runtime/worker/reporter.py`, 2 ms) in every worker process, for an A/B of it: the entry
file runs as it is, after a line that sets the constant.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from benchmarks.engine_throughput import (
    fresh_database,
    process_cpu,
    raw_pgmq,
    server,
    server_cpu,
)
from pgflow_gen.runtime import migrations

PROJECT = Path(__file__).parent / "project"
DEADLINE_S = 300.0
#: Messages each raw PGMQ client sends, reads and archives.
RAW_MESSAGES = 6000
#: How long each steady-traffic phase starts runs.
STEADY_S = 10.0
#: The reporter's linger in seconds in every worker process; None leaves its default.
LINGER_S: float | None = None


class Worker:
    def __init__(self, url: str, module: str, logs: Path, **env: str) -> None:
        self.module = module
        self.log_path = logs / f"{module}.{time.monotonic_ns()}.log"
        self._log = self.log_path.open("w")
        entry = f"app.pgflow.workers.{module}"
        command = [sys.executable, "-m", entry]
        if LINGER_S is not None:
            command = [
                sys.executable,
                "-c",
                "import runpy, pgflow_gen.runtime.worker.reporter as reporter;"
                f" reporter.REPORT_LINGER_S = {LINGER_S!r};"
                f" runpy.run_module({entry!r}, run_name='__main__', alter_sys=True)",
            ]
        self.proc = subprocess.Popen(
            command,
            cwd=PROJECT,
            env={**os.environ, "PGFLOW_DATABASE_URL": url, "PYTHONUNBUFFERED": "1", **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def cpu(self) -> float:
        """CPU seconds the worker process has used."""
        return process_cpu(self.proc.pid)

    def wait_started(self) -> None:
        until(lambda: " started (" in self.log_path.read_text(), f"{self.log_path.name}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self._log.close()


@contextmanager
def workers(url: str, *modules: str, **env: str) -> Iterator[list[Worker]]:
    logs = Path(tempfile.mkdtemp(prefix="pgflow-bench-logs-"))
    started = [Worker(url, module, logs, **env) for module in modules]
    try:
        for worker in started:
            worker.wait_started()
        yield started
    finally:
        for worker in started:
            worker.stop()


def until(check: Callable[[], Any], what: str, deadline: float = DEADLINE_S) -> None:
    end = time.monotonic() + deadline
    while not check():
        if time.monotonic() > end:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)


def until_completed(conn: psycopg.Connection[Any], runs: int, flow: str) -> None:
    """Wait until `runs` runs (every run there is) have completed."""
    until(
        lambda: count(conn, "select count(*) from pgflow.runs where status = 'completed'") == runs,
        f"every {flow} run",
    )


def count(conn: psycopg.Connection[Any], query: str, *params: Any) -> int:
    row = conn.execute(query, params).fetchone()
    return int(row[0]) if row else 0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def migrated(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        migrations.migrate(conn)


CHAIN = ("bench_chain.one", "bench_chain.two", "bench_chain.three")


@dataclass(frozen=True)
class Cpu:
    """CPU time per item (task or message) in us: the clients' (worker processes, or raw PGMQ
    clients) and the whole server's (None when the server is not a local process)."""

    clients: float
    server: float | None

    def __str__(self) -> str:
        if self.server is None:
            return f"clients {self.clients:,.0f} us (the server's CPU cannot be read from here)"
        total = self.clients + self.server
        return f"clients {self.clients:,.0f} + server {self.server:,.0f} = {total:,.0f} us"


def throughput(url: str, runs: int, py_spy: Path | None = None) -> tuple[float, Cpu]:
    """(tasks per second, CPU per task) of RUNS runs started at once. With `py_spy`, each
    worker's stacks are sampled into PY_SPY/<module>.txt (py-spy's collapsed format) meanwhile."""
    migrated(url)
    with workers(url, *CHAIN) as started, psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "select pgflow.start_flow('benchChain', jsonb_build_object('i', i))"
            " from generate_series(1, %s) as i",
            (runs,),
        )  # one transaction: every first task becomes visible at the same moment
        with sampled(started, py_spy):
            cpu_before, server_before = sum(w.cpu() for w in started), server_cpu(conn)
            began = time.perf_counter()
            until_completed(conn, runs, "benchChain")
            elapsed = time.perf_counter() - began
            cpu, server_after = sum(w.cpu() for w in started), server_cpu(conn)
        tasks = 3 * runs
        return tasks / elapsed, Cpu(
            1e6 * (cpu - cpu_before) / tasks, per_item(server_before, server_after, tasks)
        )


def per_item(before: float | None, after: float | None, items: int) -> float | None:
    """Microseconds per item between two CPU readings (None if either is unknown)."""
    return None if before is None or after is None else 1e6 * (after - before) / items


@contextmanager
def sampled(started: list[Worker], into: Path | None) -> Iterator[None]:
    """While the block runs, py-spy samples each worker's stacks into INTO/<module>.txt."""
    if into is None:
        yield
        return
    into.mkdir(parents=True, exist_ok=True)
    spies = []
    for w in started:
        output = str(into / f"{w.module}.txt")
        command = [py_spy(), "record", "--pid", str(w.proc.pid), "--rate", "250",
                   "--nonblocking", "--format", "raw", "--output", output]  # fmt: skip
        spies.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    try:
        yield
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file when interrupted
        for spy in spies:
            _, err = spy.communicate(timeout=60)
            if spy.returncode != 0:
                print(f"py-spy failed: {err.decode(errors='replace').strip()}", file=sys.stderr)


def py_spy() -> str:
    """The py-spy executable: beside this Python's (the dev environment installs it) or on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise SystemExit("--py-spy needs py-spy: make test installs it, or pip install py-spy")
    return found


def raw_with_cpu(url: str, clients: int) -> tuple[float, Cpu]:
    """Raw PGMQ at batch 10 by `clients` clients (engine_throughput.raw_pgmq): (messages per
    second, CPU per message, the clients' from their processes' resource usage)."""
    with psycopg.connect(url, autocommit=True) as conn:
        server_before = server_cpu(conn)
        own_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        result = raw_pgmq(url, RAW_MESSAGES, 10, clients)
        own_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        server_after = server_cpu(conn)
    messages = RAW_MESSAGES * clients
    used = (own_after.ru_utime - own_before.ru_utime) + (own_after.ru_stime - own_before.ru_stime)
    return result.rate, Cpu(1e6 * used / messages, per_item(server_before, server_after, messages))


def latency(url: str, runs: int = 300) -> list[float]:
    migrated(url)
    with workers(url, *CHAIN), psycopg.connect(url, autocommit=True) as conn:
        for i in range(runs):
            conn.execute("select pgflow.start_flow('benchChain', %s)", (Jsonb({"i": i}),))
            time.sleep(0.02)  # the arrival rate of the measurement, not a synchronisation
        until_completed(conn, runs, "benchChain")
        return handoffs(conn)


def handoffs(conn: psycopg.Connection[Any], since: int = 0) -> list[float]:
    """Milliseconds from each completion to the claim of its dependent task, from the engine's
    timestamps, for the runs started with an input `i` of at least `since`."""
    rows = conn.execute(
        "select extract(epoch from (t.started_at - d.completed_at)) * 1000"
        " from pgflow.step_tasks as t"
        " join pgflow.runs as r on r.run_id = t.run_id and (r.input ->> 'i')::int >= %s"
        " join pgflow.deps as dep"
        " on dep.flow_slug = t.flow_slug and dep.step_slug = t.step_slug"
        " join pgflow.step_tasks as d on d.run_id = t.run_id and d.step_slug = dep.dep_slug",
        (since,),
    ).fetchall()
    return [float(r[0]) for r in rows]


@dataclass(frozen=True)
class Phase:
    """One steady-traffic phase: runs started and their rate, tasks completed per second,
    handoffs (ms) and the workers' CPU time per task (us)."""

    runs: int
    start_rate: float
    tasks_per_s: float
    handoffs: list[float]
    cpu_us: float

    def line(self, name: str) -> str:
        h = self.handoffs
        return (
            f"{name}: {self.runs} runs started at {self.start_rate:,.0f}/s, {self.tasks_per_s:,.0f}"
            f" tasks/s; handoff p50 {percentile(h, 50):.1f} ms, p95 {percentile(h, 95):.1f} ms,"
            f" p99 {percentile(h, 99):.1f} ms; worker CPU {self.cpu_us:,.0f} us per task"
        )


def steady(url: str) -> tuple[Phase, Phase]:
    """(as fast as one client can, half the rate that completed) on one database."""
    migrated(url)
    with workers(url, *CHAIN) as started, psycopg.connect(url, autocommit=True) as conn:
        fastest = _phase(conn, started, rate=None, first=0)
        half = fastest.tasks_per_s / 3 / 2
        return fastest, _phase(conn, started, rate=half, first=fastest.runs)


def _phase(
    conn: psycopg.Connection[Any], started: list[Worker], rate: float | None, first: int
) -> Phase:
    """Start runs one by one for STEADY_S seconds (at `rate` per second, or as fast as this
    client can), numbered from `first`, and wait until they complete."""
    cpu_before = sum(w.cpu() for w in started)
    begin = time.perf_counter()
    i = first
    while (now := time.perf_counter()) - begin < STEADY_S:
        if rate is not None and (due := begin + (i - first) / rate) > now:
            time.sleep(due - now)  # the arrival rate of the measurement, not a synchronisation
        conn.execute("select pgflow.start_flow('benchChain', %s)", (Jsonb({"i": i}),))
        i += 1
    runs = i - first
    start_rate = runs / (time.perf_counter() - begin)
    until_completed(conn, i, "benchChain")
    elapsed = time.perf_counter() - begin
    cpu = sum(w.cpu() for w in started) - cpu_before
    return Phase(
        runs, start_rate, 3 * runs / elapsed, handoffs(conn, first), 1e6 * cpu / (3 * runs)
    )


def retry_lateness(url: str, runs: int = 50) -> list[float]:
    """Milliseconds from the end of each retry's delay to its start."""
    migrated(url)
    with workers(url, "bench_retry.flaky"), psycopg.connect(url, autocommit=True) as conn:
        for i in range(runs):
            conn.execute("select pgflow.start_flow('benchRetry', %s)", (Jsonb({"i": i}),))
            time.sleep(0.1)  # the arrival rate of the measurement, not a synchronisation
        until_completed(conn, runs, "benchRetry")
        rows = conn.execute(
            "select (output #>> '{}')::float8, substring(error_message from 'failed at ([0-9.]+)')"
            " from pgflow.step_tasks where step_slug = 'flaky' and attempts_count = 2"
        ).fetchall()
    delay_s = 2.0  # base_delay * 2^1
    return [1000 * (float(started) - float(failed) - delay_s) for started, failed in rows]


def fast_latencies(conn: psycopg.Connection[Any], flow: str, run_ids: list[Any]) -> list[float]:
    until(
        lambda: count(
            conn,
            "select count(*) from pgflow.step_states where run_id = any(%s)"
            " and step_slug = 'fast' and status = 'completed'",
            run_ids,
        ) == len(run_ids),
        f"the fast steps of {flow}",
    )  # fmt: skip
    rows = conn.execute(
        "select extract(epoch from (s.completed_at - r.started_at)) * 1000"
        " from pgflow.step_states as s join pgflow.runs as r using (run_id)"
        " where s.run_id = any(%s) and s.step_slug = 'fast'",
        (run_ids,),
    ).fetchall()
    return [float(r[0]) for r in rows]


def isolation(
    url: str, flow: str, modules: tuple[str, ...], probes: int = 100
) -> tuple[float, float]:
    """(idle p95, p95 with a 500-task slow backlog) of the fast step's latency, in ms."""
    migrated(url)
    with workers(url, *modules), psycopg.connect(url, autocommit=True) as conn:

        def probe() -> list[float]:
            ids = []
            for _ in range(probes):
                row = conn.execute(
                    "select run_id from pgflow.start_flow(%s, '[]')", (flow,)
                ).fetchone()
                assert row is not None
                ids.append(row[0])
                time.sleep(0.01)  # arrival rate of the probes
            return fast_latencies(conn, flow, ids)

        idle = percentile(probe(), 95)
        conn.execute(
            "select pgflow.start_flow(%s, to_jsonb(array(select generate_series(1, 500))))",
            (flow,),
        )
        busy = percentile(probe(), 95)
        return idle, busy


def idle_cost(url: str, seconds: float = 20.0) -> tuple[float, float]:
    """(CPU % of one core, transactions/s) of one idle worker."""
    migrated(url)
    with workers(url, "bench_chain.one") as started, psycopg.connect(url, autocommit=True) as conn:
        time.sleep(3)  # let startup settle before the measured window
        pid = started[0].proc.pid
        dbname = conn.info.dbname

        def commits() -> int:
            return count(
                conn, "select xact_commit from pg_stat_database where datname = %s", dbname
            )

        conn.execute("select pg_stat_clear_snapshot()")
        before_commits, before_cpu = commits(), process_cpu(pid)
        time.sleep(seconds)  # the measured idle window
        conn.execute("select pg_stat_clear_snapshot()")
        after_commits, after_cpu = commits(), process_cpu(pid)
        own = 3  # this function's own statements inside the window
        return (
            100 * (after_cpu - before_cpu) / seconds,
            max(0, after_commits - before_commits - own) / seconds,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1500)
    parser.add_argument(
        "--only",
        nargs="+",
        default=["throughput", "latency", "steady", "isolation", "idle", "retry"],
    )
    parser.add_argument(
        "--durable", action="store_true", help="the server's durable defaults (fsync on)"
    )
    parser.add_argument(
        "--linger-ms", type=float, help="the reporter's linger in the worker processes"
    )
    parser.add_argument(
        "--py-spy",
        type=Path,
        metavar="DIR",
        help="sample the throughput workers' stacks with py-spy into DIR/<module>.txt",
    )
    args = parser.parse_args(argv)
    if args.py_spy is not None:
        py_spy()  # missing: said now, not after the raw measurements
    global LINGER_S
    if args.linger_ms is not None:
        LINGER_S = args.linger_ms / 1000
    print(
        ("durable (server defaults)" if args.durable else "fast settings")
        + ("" if LINGER_S is None else f", reporter linger {args.linger_ms:g} ms"),
        flush=True,
    )
    with server(args.durable) as admin:
        if "throughput" in args.only:
            with fresh_database(admin) as url:
                raw1, _ = raw_with_cpu(url, 1)
            with fresh_database(admin) as url:
                raw3, raw3_cpu = raw_with_cpu(url, 3)
            with fresh_database(admin) as url:
                rate, cpu = throughput(url, args.runs, args.py_spy)
            print(
                f"throughput: {rate:,.0f} tasks/s ({args.runs} runs x 3 steps, 3 workers),"
                f" worker CPU {cpu.clients:,.0f} us per task"
            )
            print(f"  raw PGMQ batch 10: 1 client {raw1:,.0f} msg/s, 3 clients {raw3:,.0f} msg/s")
            print(f"  ratio: {100 * rate / raw1:.1f} % of 1 client, {100 * rate / raw3:.1f} % of 3")
            print(f"  CPU per task: {cpu}; per raw message (3 clients): {raw3_cpu}")
            if args.py_spy is not None:
                print(f"  the workers' stacks: {args.py_spy}/<module>.txt (py-spy, collapsed)")
        if "latency" in args.only:
            with fresh_database(admin) as url:
                waits = latency(url)
            print(
                f"handoff latency ({len(waits)} handoffs): p50 {percentile(waits, 50):.1f}"
                f" ms, p95 {percentile(waits, 95):.1f} ms, p99 {percentile(waits, 99):.1f} ms"
            )
        if "steady" in args.only:
            with fresh_database(admin) as url:
                fastest, half = steady(url)
            print(fastest.line("steady, as fast as one client starts runs"), flush=True)
            print(half.line("steady, at half that rate"), flush=True)
        if "isolation" in args.only:
            modes = {
                "step": ("isoSteps", ("iso_steps.slow", "iso_steps.fast")),
                "flow": ("isoFlow", ("iso_flow.worker",)),
            }
            for mode, (flow, modules) in modes.items():
                with fresh_database(admin) as url:
                    idle, busy = isolation(url, flow, modules)
                print(
                    f"isolation ({mode} mode): fast step p95 idle {idle:.1f} ms, with a 500-task"
                    f" slow backlog {busy:.1f} ms ({busy / idle:.1f}x)"
                )
        if "idle" in args.only:
            with fresh_database(admin) as url:
                core_percent, tps = idle_cost(url)
            print(f"idle worker: {core_percent:.2f} % of a core, {tps:.2f} transactions/s")
        if "retry" in args.only:
            with fresh_database(admin) as url:
                late = retry_lateness(url)
            print(
                f"retry lateness ({len(late)} retries, delay 2 s): p50 {percentile(late, 50):.1f}"
                f" ms, p95 {percentile(late, 95):.1f} ms, max {max(late):.1f} ms"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

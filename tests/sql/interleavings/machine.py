"""Random interleavings on the real engine (engine 0020): a seeded random walk of actions.

Workers claim, complete, fail (now and then for good) and crash; stall recovery sweeps; time
passes (retry delays run out); operators cancel, retry, pause and resume; signals arrive; stale
workers resend results of attempts from before. After every step the engine's promise is checked:

    every started run has a task that is queued (its message in the queue, visible now or after a
    retry delay or a pause), parked by its concurrency key, or started (held by a worker, or one
    stall recovery will take back), or a signal step that waits: something will move it.

At the end of each walk every worker comes back and every run must finish (completed, failed
or cancelled) within a bounded number of rounds. `make test` runs a short form
(test_no_run_hangs.py); `benchmarks/interleavings.py` runs it for minutes. A walk is a plain
seeded random.Random (not a Hypothesis state machine: the database's answers feed the choices,
which Hypothesis's replay cannot reproduce); a failure names its seed and its last actions."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from psycopg.types.json import Jsonb

from pgflow_gen.runtime.claimed_task import ClaimedTask as Task
from tests.engine import Engine

FLOW = "chaos"
#: How many rounds the final drain may take before a run counts as hanging.
DRAIN_ROUNDS = 60


def define(engine: Engine) -> None:
    """list -> each (a map keyed by tenant, 1 in flight per tenant) -> merge; list -> gate (a
    signal step) -> merge. Few attempts and short delays, so budgets run out often."""
    engine.compile(
        FLOW,
        [
            {"slug": "list", "options": {"maxAttempts": 2, "baseDelay": 1, "timeout": 5}},
            {
                "slug": "each",
                "deps": ["list"],
                "stepType": "map",
                "whenExhausted": "skip",
                "options": {
                    "maxAttempts": 2,
                    "baseDelay": 1,
                    "timeout": 5,
                    "concurrencyKey": "$.tenant",
                    "concurrencyLimit": 1,
                },
            },
            {"slug": "gate", "deps": ["list"], "stepType": "signal"},
            {"slug": "merge", "deps": ["each", "gate"], "options": {"maxAttempts": 1}},
        ],
        mode="flow",
        options={"maxAttempts": 2, "baseDelay": 1, "timeout": 5},
    )


@dataclass
class Figures:
    """What the examples did, for the soak script's report."""

    walks: int = 0
    steps: int = 0
    checks: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    actions: Counter[str] = field(default_factory=Counter)


#: How often each action is drawn: crashes and sweeps often enough that a task stalls again and
#: again (the engine gives up on the fourth stall), operators now and then.
WEIGHTS = {
    "start": 1.0,
    "claim": 4.0,
    "complete": 1.5,
    "fail": 1.0,
    "crash": 5.0,
    "sweep": 3.0,
    "time_passes": 2.0,
    "resend_stale": 1.0,
    "cancel": 0.2,
    "retry": 1.0,
    "pause": 0.5,
    "resume": 0.5,
    "signal": 1.0,
}

#: The invariant as one query: the started runs among the given ones that nothing will move.
STUCK_RUNS = """
select r.run_id from pgflow.runs as r
where r.run_id = any(%s) and r.status = 'started'
  and not exists (
    select 1 from pgflow.step_tasks as t
    where t.run_id = r.run_id and (
      (t.status = 'queued' and exists (
        select 1 from pgmq.q_chaos as q where q.msg_id = t.message_id))
      or (t.status = 'queued' and t.message_id is null and exists (
        select 1 from pgflow.parked_tasks as p
        where p.run_id = t.run_id and p.step_slug = t.step_slug and p.task_index = t.task_index))
      or (t.status = 'started' and t.permanently_stalled_at is null)
    )
  )
  and not exists (
    select 1 from pgflow.step_states as ss
    join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    where ss.run_id = r.run_id and ss.status = 'started' and s.step_type = 'signal'
  )
"""


class Walk:
    """One random walk over the engine, from a seed."""

    def __init__(self, engine: Engine, figures: Figures, seed: int) -> None:
        self.engine = engine
        self.figures = figures
        self.seed = seed
        self.rng = random.Random(seed)
        self.log: list[str] = []
        self.runs: list[uuid.UUID] = []
        self.held: list[Task] = []  # attempts a live worker runs
        self.lost: list[Task] = []  # attempts whose worker crashed
        self.claimed: list[Task] = []  # every attempt claimed, for stale resends
        self.signalled: set[uuid.UUID] = set()
        self.actions: dict[str, Callable[[], bool]] = {
            "start": self.start,
            "claim": self.claim,
            "complete": self.complete,
            "fail": self.fail,
            "crash": self.crash,
            "sweep": self.sweep,
            "time_passes": self.time_passes,
            "resend_stale": self.resend_stale,
            "cancel": self.cancel,
            "retry": self.retry,
            "pause": self.pause,
            "resume": self.resume,
            "signal": self.signal,
        }

    def walk(self, steps: int) -> None:
        """`steps` actions, the promise checked after each; then the drain."""
        self.figures.walks += 1
        names = sorted(self.actions)
        weights = [WEIGHTS[name] for name in names]
        for _ in range(steps):
            [name] = self.rng.choices(names, weights)
            if self.actions[name]():
                self.figures.steps += 1
                self.figures.actions[name] += 1
                self.check()
        self.drain()

    def _note(self, text: str) -> None:
        self.log.append(text)

    def _where(self) -> str:
        return f"seed {self.seed}; last actions: " + "; ".join(self.log[-15:])

    # -- helpers -------------------------------------------------------------------------------
    def _pick(self, tasks: list[Task]) -> Task:
        return tasks.pop(self.rng.randrange(len(tasks)))

    def _status(self, run_id: uuid.UUID) -> str:
        return str(self.engine.value("select status from pgflow.runs where run_id = %s", run_id))

    def _runs_in(self, status: str) -> list[uuid.UUID]:
        return [
            row["run_id"]
            for row in self.engine.all(
                "select run_id from pgflow.runs where run_id = any(%s) and status = %s"
                " order by started_at, run_id",
                self.runs,
                status,
            )
        ]

    @staticmethod
    def _output(task: Task) -> Any:
        if task.step_slug == "list":
            return list(range(int(task.flow_input["n"])))
        if task.step_slug == "each":
            return task.input
        return "merged"

    @staticmethod
    def _name(task: Task) -> str:
        return f"{task.step_slug}[{task.task_index}]#{task.attempt} of {str(task.run_id)[:8]}"

    def _backdate(self, task: Task) -> None:
        """The crashed attempt's lease runs out (its timeout + the stall rule's 30 s)."""
        self.engine.conn.execute(
            "update pgflow.step_tasks set started_at = now() - interval '60 seconds'"
            " where run_id = %s and step_slug = %s and task_index = %s and attempts_count = %s"
            " and status = 'started'",
            (task.run_id, task.step_slug, task.task_index, task.attempt),
        )

    # -- actions: each returns whether it did something --------------------------------------------
    def start(self) -> bool:
        n, tenant = self.rng.randint(0, 3), self.rng.choice(["a", "b"])
        run_id = self.engine.start(FLOW, {"n": n, "tenant": tenant})
        self.runs.append(run_id)
        self._note(f"start {str(run_id)[:8]} n={n} {tenant}")
        return True

    def claim(self) -> bool:
        tasks = self.engine.poll(FLOW, qty=self.rng.randint(1, 4))
        self.held += tasks
        self.claimed += tasks
        self._note("claim " + ", ".join(self._name(t) for t in tasks))
        return True

    def complete(self) -> bool:
        if not self.held:
            return False
        task = self._pick(self.held)
        self._note(f"complete {self._name(task)}")
        self.engine.complete(task, self._output(task), fenced=True)
        return True

    def fail(self) -> bool:
        if not self.held:
            return False
        task = self._pick(self.held)
        permanent = self.rng.random() < 0.2
        self._note(f"fail {self._name(task)}{' for good' if permanent else ''}")
        self.engine.call(
            "fail_task",
            task.run_id,
            task.step_slug,
            task.task_index,
            "boom",
            task.attempt,
            "no use" if permanent else None,
        )
        return True

    def crash(self) -> bool:
        if not self.held:
            return False
        task = self._pick(self.held)
        self._note(f"crash {self._name(task)}")
        self.lost.append(task)
        return True

    def sweep(self) -> bool:
        """Stall recovery runs after the crashed attempts' leases ran out."""
        for task in self.lost:
            self._backdate(task)
        self.lost.clear()
        swept = self.engine.value("select pgflow.requeue_stalled_tasks()")
        self._note(f"sweep ({swept})")
        return True

    def time_passes(self) -> bool:
        """Retry delays and held-out messages run out."""
        self.engine.make_visible(FLOW)
        self._note("time passes")
        return True

    def resend_stale(self) -> bool:
        """A worker resends a result of an attempt that is not current any more: nothing changes."""
        if not self.claimed:
            return False
        task = self.rng.choice(self.claimed)
        before = self.engine.task(task.run_id, task.step_slug, task.task_index)
        if before["attempts_count"] == task.attempt:
            return False  # the current attempt: its result is no resend
        complete = self.rng.random() < 0.5
        self._note(f"resend {'completion' if complete else 'failure'} of {self._name(task)}")
        if complete:
            self.engine.complete(task, "stale", fenced=True)
        else:
            self.engine.fail(task, "stale", fenced=True)
        after = self.engine.task(task.run_id, task.step_slug, task.task_index)
        assert after == before, f"a stale resend changed the task; {self._where()}"
        return True

    def cancel(self) -> bool:
        started = self._runs_in("started")
        if not started:
            return False
        run_id = self.rng.choice(started)
        self._note(f"cancel {str(run_id)[:8]}")
        self.engine.call("cancel_run", run_id, "chaos")
        return True

    def retry(self) -> bool:
        failed = self._runs_in("failed")
        if not failed:
            return False
        run_id = self.rng.choice(failed)
        self._note(f"retry {str(run_id)[:8]}")
        self.engine.call("retry_run", run_id)
        return True

    def pause(self) -> bool:
        step = self.rng.choice(["list", "each", "merge"])
        self._note(f"pause {step}")
        self.engine.call("pause_step", FLOW, step, "chaos")
        return True

    def resume(self) -> bool:
        step = self.rng.choice(["list", "each", "merge"])
        self._note(f"resume {step}")
        self.engine.call("resume_step", FLOW, step)
        return True

    def signal(self) -> bool:
        waiting = [r for r in self._runs_in("started") if r not in self.signalled]
        if not waiting:
            return False
        run_id = self.rng.choice(waiting)
        self._note(f"signal {str(run_id)[:8]}")
        self.engine.call("send_signal", run_id, "gate", Jsonb({"ok": True}))
        self.signalled.add(run_id)
        return True

    # -- the promise -----------------------------------------------------------------------------
    def check(self) -> None:
        self.figures.checks += 1
        stuck = [row["run_id"] for row in self.engine.all(STUCK_RUNS, self.runs)]
        assert stuck == [], f"started runs nothing will move: {stuck}; {self._where()}"

    def drain(self) -> None:
        """Every worker comes back, pauses end, signals arrive: every run finishes."""
        self._note("drain")
        for step in ("list", "each", "merge"):
            self.engine.call("resume_step", FLOW, step)
        for _ in range(DRAIN_ROUNDS):
            started = self._runs_in("started")
            if not started:
                break
            for run_id in started:
                if run_id not in self.signalled:
                    self.engine.call("send_signal", run_id, "gate", Jsonb({"ok": True}))
                    self.signalled.add(run_id)
            for task in self.held:
                self.engine.complete(task, self._output(task), fenced=True)
            self.held.clear()
            self.sweep()
            self.engine.make_visible(FLOW)
            for task in self.engine.poll(FLOW, qty=50):
                self.engine.complete(task, self._output(task), fenced=True)
        hanging = self._runs_in("started")
        assert hanging == [], (
            f"runs still started after {DRAIN_ROUNDS} rounds: {hanging}; {self._where()}"
        )
        for run_id in self.runs:
            self.figures.outcomes[self._status(run_id)] += 1

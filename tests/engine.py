"""A thin test driver for the SQL engine: it plays the worker's part with plain SQL calls, so
tests read as the behaviour they pin (start a run, poll, complete, fail) and stay short."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from pgflow_gen.runtime.claimed_task import ClaimedTask as Task

#: The columns of pgflow.start_tasks (the claim before engine 0005).
START_TASKS_COLUMNS = (
    "flow_slug",
    "run_id",
    "step_slug",
    "input",
    "msg_id",
    "task_index",
    "flow_input",
)
WORKER_ID = uuid.UUID("00000000-0000-0000-0000-0000000000aa")


def shape_step(slug: str, deps: tuple[str, ...] | list[str] = (), **extra: Any) -> dict[str, Any]:
    """One step of a flow shape, with the defaults a worker sends."""
    return {
        "slug": slug,
        "stepType": extra.pop("stepType", "single"),
        "dependencies": sorted(deps),
        "whenUnmet": extra.pop("whenUnmet", "skip"),
        "whenExhausted": extra.pop("whenExhausted", "fail"),
        "requiredInputPattern": extra.pop("requiredInputPattern", {"defined": False}),
        "forbiddenInputPattern": extra.pop("forbiddenInputPattern", {"defined": False}),
        **extra,
    }


class Engine:
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self._registered: set[str] = set()

    # -- definitions -----------------------------------------------------------------------
    def flow(self, slug: str, *steps: dict[str, Any], **options: Any) -> str:
        """create_flow + add_step for each step dict (keys as add_step's parameters)."""
        self.call("create_flow", slug, **options)
        for step in steps:
            step = dict(step)
            self.call("add_step", slug, step.pop("slug"), **step)
        return slug

    def compile(
        self,
        slug: str,
        steps: list[dict[str, Any]],
        mode: str = "step",
        route_map: Any = "derive",
        options: dict[str, Any] | None = None,
        schedules: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """ensure_flow_compiled with a shape built from short step dicts ({slug, deps?, ...});
        the route map is derived with derive_queue_routes unless given. With the flow's
        `options` the shape is a described one, as generated code sends: its options apply."""
        shape: dict[str, Any] = {"steps": [shape_step(**step) for step in steps]}
        if options is not None:
            shape["options"] = options
        if schedules is not None:
            shape["schedules"] = schedules
        if route_map == "derive":
            route_map = [
                {"stepSlug": r["step_slug"], "queueName": r["queue_name"]}
                for r in self.all(
                    "select * from pgflow.derive_queue_routes(%s, %s, %s)",
                    slug,
                    [step["slug"] for step in steps],
                    mode,
                )
            ]
        result: dict[str, Any] = self.value(
            "select pgflow.ensure_flow_compiled(%s, %s, %s, %s)",
            slug,
            Jsonb(shape),
            mode,
            None if route_map is None else Jsonb(route_map),
        )
        return result

    def call(self, function: str, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        """select * from pgflow.<function>(args..., name => value...)."""
        params: list[Any] = [self._adapt(a) for a in args]
        named = []
        for key, value in kwargs.items():
            named.append(f"{key} => %s")
            params.append(self._adapt(value))
        placeholders = ", ".join(["%s"] * len(args) + named)
        query = f"select * from pgflow.{function}({placeholders})"
        with self.conn.cursor(row_factory=dict_row) as cur:
            cur.execute(query, params)
            return cur.fetchall() if cur.description else []

    @staticmethod
    def _adapt(value: Any) -> Any:
        return Jsonb(value) if isinstance(value, dict) else value

    # -- runs ------------------------------------------------------------------------------
    def start(self, flow_slug: str, input: Any = None, *, priority: int | None = None) -> uuid.UUID:
        input = {} if input is None else input
        extra = {} if priority is None else {"priority": priority}
        rows = self.call("start_flow", flow_slug, Jsonb(input), **extra)
        return rows[0]["run_id"]  # type: ignore[no-any-return]

    def poll(
        self,
        flow_slug: str,
        queue: str | None = None,
        qty: int = 50,
        vt: int = 30,
        step: str | None = None,
    ) -> list[Task]:
        """Read visible messages and claim them (the worker's two-phase claim)."""
        queue = queue or flow_slug.lower()
        self.register(queue)
        ids = [
            r[0]
            for r in self.conn.execute(
                "select msg_id from pgmq.read(%s, %s, %s)", (queue, vt, qty)
            ).fetchall()
        ]
        return self.claim(flow_slug, ids, queue, step=step)

    def claim(
        self,
        flow_slug: str,
        msg_ids: list[int],
        queue: str | None = None,
        step: str | None = None,
    ) -> list[Task]:
        """claim_tasks (the worker's claim) with the given selector (four arguments when `step`
        is None)."""
        queue = queue or flow_slug.lower()
        self.register(queue)
        selector = [] if step is None else [step]
        placeholders = ", ".join(["%s"] * (4 + len(selector)))
        args = (flow_slug, msg_ids, WORKER_ID, queue, *selector)
        if self.value("select to_regproc('pgflow.claim_tasks')") is not None:
            rows = self.conn.execute(f"select * from pgflow.claim_tasks({placeholders})", args)
            return [Task(*row) for row in rows.fetchall()]
        # An engine older than 0005 (upgrade tests) has start_tasks only: the attempt and the
        # timeout are read afterwards.
        rows = self.conn.execute(f"select * from pgflow.start_tasks({placeholders})", args)
        claimed = []
        for row in rows.fetchall():
            fields = dict(zip(START_TASKS_COLUMNS, row, strict=True))
            extra = self.one(
                "select t.attempts_count, coalesce(s.opt_timeout, f.opt_timeout) as timeout"
                " from pgflow.step_tasks t"
                " join pgflow.steps s using (flow_slug, step_slug)"
                " join pgflow.flows f using (flow_slug)"
                " where t.run_id = %s and t.step_slug = %s and t.task_index = %s",
                fields["run_id"],
                fields["step_slug"],
                fields["task_index"],
            )
            claimed.append(
                Task(**fields, attempt=extra["attempts_count"], timeout=extra["timeout"])
            )
        return claimed

    def register(self, queue: str) -> None:
        if queue not in self._registered:
            self.conn.execute("select pgflow.register_worker(%s, %s, 'tests')", (WORKER_ID, queue))
            self._registered.add(queue)

    def complete(self, task: Task, output: Any = None, *, fenced: bool = False) -> dict[str, Any]:
        """complete_task; `fenced` passes the task's attempt (as workers do), else the callback
        without one (as workers before engine 0005 did)."""
        return self.call(
            "complete_task",
            task.run_id,
            task.step_slug,
            task.task_index,
            None if output is None else Jsonb(output),
            *([task.attempt] if fenced else []),
        )[0]

    def complete_batch(
        self, tasks: list[Task], outputs: list[Any], *, fenced: bool = False
    ) -> list[dict[str, Any]]:
        """complete_tasks: the tasks with their outputs, in one call (`fenced`: with their
        attempts)."""
        arrays: list[Any] = [
            [t.run_id for t in tasks],
            [t.step_slug for t in tasks],
            [t.task_index for t in tasks],
            [None if o is None else Jsonb(o) for o in outputs],
        ]
        attempts = ", %s::int[]" if fenced else ""
        if fenced:
            arrays.append([t.attempt for t in tasks])
        with self.conn.cursor(row_factory=dict_row) as cur:
            cur.execute(
                f"select * from pgflow.complete_tasks(%s, %s, %s, %s::jsonb[]{attempts})", arrays
            )
            return cur.fetchall()

    def fail(self, task: Task, message: str = "boom", *, fenced: bool = False) -> dict[str, Any]:
        """fail_task; `fenced` as for `complete`."""
        attempt = [task.attempt] if fenced else []
        return self.call(
            "fail_task", task.run_id, task.step_slug, task.task_index, message, *attempt
        )[0]

    def run_to_end(
        self, flow_slug: str, outputs: dict[str, Any], input: Any = None, limit: int = 100
    ) -> dict[str, Any]:
        """Start a run, then poll and complete until nothing is visible; return the run.

        `outputs` maps a step slug to its output, or to a function of the task."""
        run_id = self.start(flow_slug, input)
        for _ in range(limit):
            tasks = self.poll(flow_slug)
            if not tasks:
                break
            for task in tasks:
                value = outputs.get(task.step_slug)
                self.complete(task, value(task) if callable(value) else value)
        return self.run(run_id)

    # -- inspection ------------------------------------------------------------------------
    def one(self, query: str, *params: Any) -> dict[str, Any]:
        with self.conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(query, params).fetchone()
            assert row is not None, query
            return row

    def all(self, query: str, *params: Any) -> list[dict[str, Any]]:
        with self.conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(query, params).fetchall()

    def value(self, query: str, *params: Any) -> Any:
        row = self.conn.execute(query, params).fetchone()
        assert row is not None, query
        return row[0]

    def run(self, run_id: uuid.UUID) -> dict[str, Any]:
        return self.one("select * from pgflow.runs where run_id = %s", run_id)

    def state(self, run_id: uuid.UUID, step_slug: str) -> dict[str, Any]:
        return self.one(
            "select * from pgflow.step_states where run_id = %s and step_slug = %s",
            run_id,
            step_slug,
        )

    def tasks(self, run_id: uuid.UUID, step_slug: str) -> list[dict[str, Any]]:
        return self.all(
            "select * from pgflow.step_tasks where run_id = %s and step_slug = %s"
            " order by task_index",
            run_id,
            step_slug,
        )

    def task(self, run_id: uuid.UUID, step_slug: str, task_index: int = 0) -> dict[str, Any]:
        return self.one(
            "select * from pgflow.step_tasks"
            " where run_id = %s and step_slug = %s and task_index = %s",
            run_id,
            step_slug,
            task_index,
        )

    def queued_messages(self, queue: str) -> list[dict[str, Any]]:
        return self.all(f"select * from pgmq.q_{queue} order by msg_id")

    def archived_ids(self, queue: str) -> set[int]:
        return {r["msg_id"] for r in self.all(f"select msg_id from pgmq.a_{queue}")}

    def backdate_started(self, run_id: uuid.UUID, step_slug: str, seconds: int) -> None:
        """Pretend the step's started tasks were claimed `seconds` ago (stall tests)."""
        self.conn.execute(
            "update pgflow.step_tasks set started_at = now() - make_interval(secs => %s),"
            " queued_at = now() - make_interval(secs => %s + 1)"
            " where run_id = %s and step_slug = %s and status = 'started'",
            (seconds, seconds, run_id, step_slug),
        )

    def make_visible(self, queue: str) -> None:
        """Expire every message's visibility timeout (as if the lease ran out)."""
        self.conn.execute(f"update pgmq.q_{queue} set vt = now() - interval '1 second'")

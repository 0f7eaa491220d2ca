"""Starting runs and reading them back, typed by the generated flow module.

>>> from app.pgflow.greet_user import FLOW                       # doctest: +SKIP
>>> run = Client().start_flow(FLOW, {"first": "Ada", "last": "Lovelace"})  # doctest: +SKIP
>>> run.wait(timeout=30).output                                 # doctest: +SKIP
{'greeting': 'Hello, Ada Lovelace!'}
"""

from __future__ import annotations

import datetime
import functools
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar, overload

import psycopg
import pydantic
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from pgflow_gen.runtime import database, errors
from pgflow_gen.runtime.flow import Flow, StepQueuedFlow

StepSlugT = TypeVar("StepSlugT", bound=str)
InputT = TypeVar("InputT")
OutputT = TypeVar("OutputT")

RunStatus = Literal["started", "completed", "failed"]


class InvalidRunInputError(errors.PgflowError):
    """A run input that does not match the flow's input type; nothing was written."""

    code = "invalid_run_input"


class RunNotFoundError(errors.PgflowError):
    code = "run_not_found"


@dataclass(frozen=True)
class Run(Generic[OutputT]):
    """A run as last read from the database; `wait()` returns a fresher one."""

    run_id: uuid.UUID
    flow_slug: str
    status: RunStatus
    input: Any
    output: OutputT | None
    started_at: datetime.datetime
    completed_at: datetime.datetime | None
    failed_at: datetime.datetime | None
    client: Client = field(repr=False, compare=False)

    @property
    def finished(self) -> bool:
        return self.status != "started"

    def wait(
        self, timeout: float = 60.0, *, every_second: Callable[[], None] | None = None
    ) -> Run[OutputT]:
        """Block until the run completes or fails, woken by the engine's notifications.

        With `every_second`, it is also called (and the run read again) once a second while the
        run goes on: a progress display, or a fallback where notifications do not arrive.
        Raises TimeoutError when it is still running after `timeout` seconds.
        """
        deadline = time.monotonic() + timeout
        with self.client.connect() as conn:
            conn.execute(
                sql.SQL("listen {}").format(sql.Identifier(f"pgflow_run_{self.run_id.hex}"))
            )
            while True:
                # Read after LISTEN and after every event, so no transition slips in between.
                current: Run[OutputT] = self.client.read_run(conn, self.run_id)
                if current.finished:
                    return current
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"Run {self.run_id} is still running after {timeout} s.")
                if every_second is not None:
                    every_second()
                    remaining = min(remaining, 1.0)
                for _event in conn.notifies(timeout=remaining, stop_after=1):
                    pass


class Client:
    """Starts and reads runs. The database: `database_url`, else the environment (see docs)."""

    def __init__(self, database_url: str | None = None) -> None:
        self._database_url = database_url

    @functools.cached_property
    def url(self) -> str:
        return database.resolve_url(self._database_url)

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url, autocommit=True)

    @overload
    def start_flow(
        self,
        flow: StepQueuedFlow[StepSlugT, InputT, OutputT],
        input: InputT,
        *,
        run_id: uuid.UUID | None = None,
    ) -> Run[OutputT]: ...

    @overload
    def start_flow(
        self,
        flow: Flow[StepSlugT, InputT, OutputT],
        input: InputT,
        *,
        run_id: uuid.UUID | None = None,
    ) -> Run[OutputT]: ...

    def start_flow(
        self,
        flow: Flow[Any, Any, Any] | StepQueuedFlow[Any, Any, Any],
        input: Any,
        *,
        run_id: uuid.UUID | None = None,
    ) -> Run[Any]:
        """Validate `input` against the flow's input type, then start a run of it."""
        plain = flow.flow if isinstance(flow, StepQueuedFlow) else flow
        validate_input(plain, input)
        with self.connect() as conn:
            row = conn.execute(
                "select run_id from pgflow.start_flow(%s, %s, %s)",
                (plain.slug, Jsonb(input), run_id),
            ).fetchone()
            if row is None:
                raise errors.DatabaseError(f'pgflow.start_flow returned no run for "{plain.slug}".')
            return self.read_run(conn, row[0])

    def get_run(self, run_id: uuid.UUID) -> Run[Any]:
        with self.connect() as conn:
            return self.read_run(conn, run_id)

    def read_run(self, conn: psycopg.Connection[Any], run_id: uuid.UUID) -> Run[Any]:
        with conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(
                "select run_id, flow_slug, status, input, output, started_at, completed_at,"
                " failed_at from pgflow.runs where run_id = %s",
                (run_id,),
            ).fetchone()
        if row is None:
            raise RunNotFoundError(f"Run {run_id} does not exist.")
        return Run(**row, client=self)


def validate_input(flow: Flow[Any, Any, Any], value: Any) -> None:
    """Raise InvalidRunInputError, naming the offending field, unless `value` fits the flow."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidRunInputError(
            f'The input of flow "{flow.slug}" is not JSON-serialisable: {exc}.'
        ) from exc
    if flow.input_type is None:
        return
    try:
        _adapter(flow.input_type).validate_python(value, strict=True)
    except pydantic.ValidationError as exc:
        problems = [
            f"{'.'.join(str(part) for part in error['loc']) or '(input)'}: {error['msg']}"
            for error in exc.errors()
        ]
        raise InvalidRunInputError(
            f'Invalid input for flow "{flow.slug}": {problems[0]}.',
            detail="; ".join(problems),
            hint="The input must match the flow's Input type (see the generated module).",
        ) from exc


@functools.cache
def _adapter(input_type: Any) -> pydantic.TypeAdapter[Any]:
    return pydantic.TypeAdapter(input_type)

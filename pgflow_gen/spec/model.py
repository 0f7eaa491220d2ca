"""The flow spec as pydantic models: one source for validation and for `schemas/flow.schema.json`.

Keys are snake_case and unknown keys are errors. `if` / `if_not` are aliases (Python reserves `if`).
Semantic rules that need the whole flow (dependency order, map rules, routes) live in `checks.py`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

WhenUnmet = Literal["skip", "skip-cascade", "fail"]
WhenExhausted = Literal["fail", "skip", "skip-cascade"]
JsonType = Literal["object", "array", "string", "number", "integer", "boolean", "null"]

REF_PREFIX = "#/$defs/"
# PostgreSQL `int` columns hold the options.
MAX_INT = 2_147_483_647
HANDLER_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True, strict=True)


class TypeSchema(_Strict):
    """The JSON Schema subset that describes run inputs and step outputs."""

    type: JsonType | Annotated[list[JsonType], Field(min_length=1)] | None = None
    description: str | None = None
    properties: dict[str, TypeSchema] | None = None
    required: list[str] | None = None
    items: TypeSchema | None = None
    enum: list[Any] | None = Field(default=None, min_length=1)
    const: Any = None
    any_of: list[TypeSchema] | None = Field(default=None, alias="anyOf", min_length=1)
    additional_properties: bool | TypeSchema | None = Field(
        default=None, alias="additionalProperties"
    )
    defs: dict[str, TypeSchema] | None = Field(default=None, alias="$defs")
    ref: str | None = Field(default=None, alias="$ref", pattern=r"^#/\$defs/[A-Za-z0-9_]+$")

    def as_json(self) -> dict[str, Any]:
        """The schema as the spec wrote it (its keys' spelling, nothing unset added), as JSON."""
        dumped: dict[str, Any] = self.model_dump(by_alias=True, exclude_unset=True, mode="json")
        return dumped

    def referenced_defs(self) -> set[str]:
        """The `$defs` keys this schema refers to with `$ref`, anywhere inside it (not inside
        nested `$defs`, which are not a scope of their own)."""
        found = set()
        pending = [self]
        while pending:
            node = pending.pop()
            if node.ref is not None:
                found.add(node.ref.removeprefix(REF_PREFIX))
            pending += [*(node.properties or {}).values(), *(node.any_of or [])]
            pending += [
                child
                for child in (node.items, node.additional_properties)
                if isinstance(child, TypeSchema)
            ]
        return found


class RetryOptions(_Strict):
    """Which failures are not retried."""

    not_on: list[str] = Field(
        default_factory=list,
        description="Exception classes that fail a task at once, whatever attempts are left: a"
        ' builtin name ("ValueError") or "package.module:ExceptionClass". A handler can also'
        " raise pgflow_gen.runtime.PermanentError.",
    )


class FlowOptions(_Strict):
    """Flow-wide defaults for every step (the values shown are the defaults)."""

    max_attempts: int = Field(
        default=3, ge=1, le=MAX_INT, description="Attempts per task, the first included."
    )
    base_delay: int = Field(
        default=5, ge=1, le=MAX_INT, description="Retry delay base: base_delay * 2^attempts s."
    )
    timeout: int = Field(
        default=60, ge=3, le=MAX_INT, description="Seconds a task may run before it is retried."
    )
    retry: RetryOptions | None = None


class RateLimit(_Strict):
    """At most `count` task starts of the step in any `per` seconds, across every worker."""

    count: int = Field(
        ge=1,
        le=MAX_INT,
        description="Task starts in any window: each attempt of a task, and each element of a"
        " map step, is a start.",
    )
    per: int = Field(ge=1, le=MAX_INT, description="The window, in seconds.")


class StepOptions(_Strict):
    """Per-step overrides of the flow options, and the step's limits (enforced by the engine
    across every worker; `pgflow-gen limits` changes them live)."""

    max_attempts: int | None = Field(default=None, ge=1, le=MAX_INT)
    base_delay: int | None = Field(default=None, ge=1, le=MAX_INT)
    timeout: int | None = Field(default=None, ge=3, le=MAX_INT)
    start_delay: int | None = Field(
        default=None, ge=0, le=MAX_INT, description="Delay of the first attempt, s."
    )
    retry: RetryOptions | None = Field(default=None, description="Replaces the flow's retry.")
    max_in_flight: int | None = Field(
        default=None,
        ge=1,
        le=MAX_INT,
        description="At most this many of the step's tasks run at once, across every worker;"
        " the others wait in the queue, using no attempt.",
    )
    rate_limit: RateLimit | None = Field(
        default=None,
        description="At most `count` task starts in any `per` seconds, across every worker;"
        " the others wait, using no attempt.",
    )

    def engine_options(self) -> dict[str, int | None]:
        """The options the engine keeps per step (retry is the worker's), its limits flat:
        max_in_flight, rate_limit (the count) and rate_period (seconds)."""
        options: dict[str, int | None] = self.model_dump(
            include={"max_attempts", "base_delay", "timeout", "start_delay", "max_in_flight"}
        )
        rate = self.rate_limit
        options["rate_limit"] = None if rate is None else rate.count
        options["rate_period"] = None if rate is None else rate.per
        return options


#: The JSON paths a concurrency key may be: `$`, then `.name` and `[index]` parts.
CONCURRENCY_KEY_PATTERN = r"\$(\.[A-Za-z_][A-Za-z0-9_]*|\[[0-9]+\])*"


class Concurrency(_Strict):
    """Fair concurrency per key: each value of `key` in the run input gets its own
    `max_in_flight` tasks of the step; the others of that value wait their turn, without a
    queue message, so one value's backlog never delays another's work."""

    key: str = Field(
        description='A JSON path into the run input, such as "$.tenant_id" or "$.account.id";'
        " a run without it counts under the empty key.",
    )
    max_in_flight: int = Field(
        ge=1,
        le=MAX_INT,
        description="Tasks of one key value queued or running at once, across every worker.",
    )


class SignalSpec(_Strict):
    """A signal step runs no handler: it waits until `pgflow-gen signal` or
    `Client.send_signal` gives it a payload, which becomes its output."""

    payload: TypeSchema | None = Field(
        default=None, description="JSON Schema of the payload (none: any JSON)."
    )
    timeout: int | None = Field(
        default=None,
        ge=1,
        le=MAX_INT,
        description="Seconds it waits; then it fails, or is skipped with when_exhausted: skip"
        " (none: it waits for ever).",
    )


class StepSpec(_Strict):
    """One step. Its position in `steps` is its step index (the topological order)."""

    # Editors learn the rule `checks.py` enforces: a step runs a handler, waits for a signal, or
    # runs another flow.
    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [{"required": ["handler"]}, {"required": ["signal"]}, {"required": ["flow"]}]
        }
    )

    slug: str = Field(description="Step slug: a letter first, then letters, digits, single _.")
    description: str | None = None
    type: Literal["single", "map"] = "single"
    array: str | None = Field(default=None, description="Map step: the dependency it maps.")
    depends_on: list[str] = Field(default_factory=list)
    if_: dict[str, Any] | None = Field(default=None, alias="if")
    if_not: dict[str, Any] | None = None
    when_unmet: WhenUnmet | None = None
    when_exhausted: WhenExhausted = "fail"
    handler: str | None = Field(
        default=None, pattern=HANDLER_PATTERN, description='"package.module:function"'
    )
    signal: SignalSpec | None = Field(
        default=None, description="Instead of a handler: the step waits for a signal."
    )
    flow: str | None = Field(
        default=None,
        description="Instead of a handler: the slug of another flow of the build, which the step"
        " runs as a subflow with the step's input (a map step: one run per element); its output"
        " is that run's output.",
    )
    output: TypeSchema | None = None
    options: StepOptions = Field(default_factory=StepOptions)
    concurrency: Concurrency | None = Field(
        default=None, description="At most `max_in_flight` tasks per value of `key` at once."
    )

    @property
    def step_type(self) -> Literal["single", "map", "signal", "subflow"]:
        if self.signal is not None:
            return "signal"
        if self.flow is not None and self.type == "single":
            return "subflow"
        return self.type

    @property
    def runs_handler(self) -> bool:
        """Whether a worker runs the step (every step but signal and subflow steps)."""
        return self.signal is None and self.flow is None


class ScheduleSpec(_Strict):
    """A periodic run of the flow: the workers start it (one of them per database), once per
    slot of its cron expression."""

    name: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z][A-Za-z0-9_-]*$",
        description="How `pgflow-gen schedules` names it (default: schedule_<n>, its position"
        " from 1); a renamed schedule starts afresh.",
    )
    cron: str = Field(
        description='Five fields, minute hour day month weekday ("*/5 * * * *"), or six with'
        " the seconds last, read by croniter."
    )
    input: Any = Field(
        default_factory=dict, description="The run input, checked against the flow's input."
    )
    timezone: str = Field(default="UTC", description="The IANA time zone the cron is read in.")
    catch_up: Literal["none", "latest", "all"] = Field(
        default="none",
        description="Slots missed while no worker ran: none (pass them over), latest (start"
        " the latest one) or all (start each, at most 100).",
    )
    priority: int = Field(
        default=0,
        ge=0,
        le=1000,
        description="The priority of its runs (0, the lowest, to 1000): their tasks are claimed"
        " before those of runs with a lower one in their queues (engine 0031).",
    )

    def resolved_name(self, index: int) -> str:
        """Its name, or schedule_<n> for the schedule at `index` (from 0) of the spec."""
        return self.name or f"schedule_{index + 1}"


#: The writes a table trigger starts runs on.
TriggerEvent = Literal["insert", "update"]
#: A value a trigger's `when` compares a column with, read as the column's type.
TriggerValue = str | int | float | bool
#: A schema-qualified table, as PostgreSQL reads an unquoted name.
TABLE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_$]*\.[A-Za-z_][A-Za-z0-9_$]*$"


class TriggerTest(_Strict):
    """Tests of one column of the written row; every one given must hold."""

    eq: TriggerValue | None = None
    ne: TriggerValue | None = None
    gt: TriggerValue | None = None
    gte: TriggerValue | None = None
    lt: TriggerValue | None = None
    lte: TriggerValue | None = None
    in_: list[TriggerValue] | None = Field(default=None, alias="in", min_length=1)
    is_null: bool | None = None
    changed: bool | None = Field(
        default=None,
        description="Whether an update changed the column (a trigger on update alone).",
    )

    def as_json(self) -> dict[str, Any]:
        """The tests as pgflow.set_flow_triggers takes them: {operator: value}."""
        tests: dict[str, Any] = self.model_dump(by_alias=True, exclude_none=True, mode="json")
        return tests


class TriggerSpec(_Strict):
    """A table trigger: a write to an application table starts a run of the flow in the
    writing transaction (engine 0032; the flow's migration installs it)."""

    name: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z][A-Za-z0-9_]{0,39}$",
        description="How `pgflow-gen flows` names it (default: trigger_<n>, its position from 1).",
    )
    table: str = Field(
        pattern=TABLE_PATTERN,
        description="The table whose writes start runs, with its schema: schema.table.",
    )
    on: list[TriggerEvent] = Field(
        default_factory=lambda: list[TriggerEvent](["insert"]),
        min_length=1,
        description="The writes that start a run: insert, update or both.",
    )
    when: dict[str, TriggerValue | list[TriggerValue] | TriggerTest | None] = Field(
        default_factory=dict,
        description="Column tests the written row must pass: a value (equal), a list (one of"
        " them), null (is null), or {eq, ne, gt, gte, lt, lte, in, is_null, changed}.",
    )
    input: dict[str, str] = Field(
        description="The run input: each input key and the column its value comes from."
    )
    on_error: Literal["raise", "skip"] = Field(
        default="raise",
        description="A start that fails: raise aborts the write; skip lets the write go on and"
        " logs the start (`pgflow-gen flows --skips`).",
    )

    def resolved_name(self, index: int) -> str:
        """Its name, or trigger_<n> for the trigger at `index` (from 0) of the spec."""
        return self.name or f"trigger_{index + 1}"

    def tests(self) -> dict[str, dict[str, Any]]:
        """`when` with its shorthands spelt out: {column: {operator: value}}."""
        tests: dict[str, dict[str, Any]] = {}
        for column, test in self.when.items():
            if isinstance(test, TriggerTest):
                tests[column] = test.as_json()
            elif isinstance(test, list):
                tests[column] = {"in": test}
            elif test is None:
                tests[column] = {"is_null": True}
            else:
                tests[column] = {"eq": test}
        return tests

    def as_json(self, index: int) -> dict[str, Any]:
        """The trigger as pgflow.set_flow_triggers takes it."""
        return {
            "name": self.resolved_name(index),
            "table": self.table,
            "on": sorted(set(self.on)),
            "when": self.tests(),
            "input": dict(self.input),
            "onError": self.on_error,
        }


class StepWorkers(_Strict):
    max_concurrent: int | None = Field(default=None, ge=1, le=MAX_INT)


class WorkersSpec(_Strict):
    """Deployment defaults written into the generated worker entry files."""

    max_concurrent: int = Field(default=10, ge=1, le=MAX_INT)
    steps: dict[str, StepWorkers] = Field(default_factory=dict)


class FlowSpec(_Strict):
    """One concrete flow (one YAML file)."""

    slug: str = Field(description="Concrete flow slug; a new shape or queue mode needs a new slug.")
    description: str | None = None
    queue_mode: Literal["flow", "step"] = "flow"
    input: TypeSchema | None = None
    options: FlowOptions = Field(default_factory=FlowOptions)
    steps: list[StepSpec] = Field(default_factory=list)
    schedules: list[ScheduleSpec] = Field(
        default_factory=list, description="Periodic runs, started by the workers."
    )
    triggers: list[TriggerSpec] = Field(
        default_factory=list,
        description="Table triggers: writes to application tables that start runs.",
    )
    workers: WorkersSpec = Field(default_factory=WorkersSpec)

"""Flow definitions as the runtime sees them: what generated modules declare and workers compile.

A `Flow` is immutable (its step order is a tuple, its patterns read-only); `with_step_queues`
turns it into a `StepQueuedFlow` whose checked routes are fixed at creation, so neither can drift
between validation and use.

>>> flow = Flow(slug="greetUser", steps=(Step(slug="greet"),))
>>> with_step_queues(flow).routes[0].queue_name
'greetuser__greet'
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, Literal, TypeAlias, cast

from typing_extensions import TypeAliasType, TypeVar

from pgflow_gen import naming
from pgflow_gen import shape as shapes

StepSlugT = TypeVar("StepSlugT", bound=str)
InputT = TypeVar("InputT")
OutputT = TypeVar("OutputT")
#: The generated `Signals` of a flow with signal steps (`FLOW.signals.approval`); a flow without
#: them has `object`. Covariant, so every flow is a `Flow[S, I, O]`.
SignalsT = TypeVar("SignalsT", covariant=True, default=object)
PayloadT = TypeVar("PayloadT")

#: Any JSON value. A TypeAliasType, so pydantic can validate it too (it is recursive).
Json = TypeAliasType("Json", "dict[str, Json] | list[Json] | str | int | float | bool | None")
_T = TypeVar("_T")
#: What a handler returns: its output, or an awaitable of it (sync and async handlers alike).
MaybeAwaitable: TypeAlias = _T | Awaitable[_T]
StepType = Literal["single", "map", "signal", "subflow"]
SkipMode = Literal["skip", "skip-cascade", "fail"]


def _frozen(value: Any) -> Any:
    """A read-only deep copy of a JSON value (mappings become MappingProxyType, lists tuples)."""
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): _frozen(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


@dataclass(frozen=True)
class FlowOptions:
    max_attempts: int = 3
    base_delay: int = 5
    timeout: int = 60
    #: Exceptions that fail a task at once, whatever attempts are left: builtin names
    #: (`ValueError`) or import paths (`app.errors:Declined`); a step's own list replaces it.
    retry_not_on: tuple[str, ...] = ()


@dataclass(frozen=True)
class StepOptions:
    max_attempts: int | None = None
    base_delay: int | None = None
    #: A signal step's timeout is how long it waits for its signal (None: for ever).
    timeout: int | None = None
    start_delay: int | None = None
    #: None: the flow's `retry_not_on`.
    retry_not_on: tuple[str, ...] | None = None
    #: The step's limits, enforced by the engine across every worker (engine 0017): tasks
    #: started at once, and task starts in any `rate_period` seconds. None: no limit.
    max_in_flight: int | None = None
    rate_limit: int | None = None
    rate_period: int | None = None
    #: Fair concurrency per key (engine 0018): a JSON path into the run input, and how many
    #: tasks of one value of it may be queued or running at once. None: no key.
    concurrency_key: str | None = None
    concurrency_limit: int | None = None


@dataclass(frozen=True)
class Signal(Generic[PayloadT]):
    """A signal step of a flow, typed by its payload: what `Client.send_signal` takes, from the
    generated module (`FLOW.signals.approval`)."""

    step_slug: str


@dataclass(frozen=True)
class Step:
    """One step of a flow, as compiled into the engine."""

    slug: str
    step_type: StepType = "single"
    dependencies: tuple[str, ...] = ()
    when_unmet: SkipMode = "skip"
    when_exhausted: SkipMode = "fail"
    required_input_pattern: Mapping[str, Any] | None = None
    forbidden_input_pattern: Mapping[str, Any] | None = None
    options: StepOptions = field(default_factory=StepOptions)
    #: The JSON Schema of what the handler returns (for a map step: of one task's output), from
    #: the spec's `output`; workers check every output against it. None: any JSON. Not compiled.
    output_schema: Mapping[str, Any] | None = field(default=None, compare=False)
    #: A signal step's payload JSON Schema (its output): stored with the flow, the engine checks
    #: every signal against it. None: any JSON.
    payload_schema: Mapping[str, Any] | None = field(default=None, compare=False)
    #: A subflow step's flow (engine 0028): each of its tasks is a run of that flow, one for a
    #: `subflow` step, one per element for a `map` step. None: the step runs a handler.
    subflow_slug: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dependencies", tuple(self.dependencies))
        for name in (
            "required_input_pattern",
            "forbidden_input_pattern",
            "output_schema",
            "payload_schema",
        ):
            pattern = getattr(self, name)
            if pattern is not None:
                object.__setattr__(self, name, _frozen(pattern))

    def shape(self) -> dict[str, Any]:
        """This step in the shape format of `pgflow.ensure_flow_compiled`."""
        return shapes.step(
            slug=self.slug,
            step_type=self.step_type,
            dependencies=self.dependencies,
            when_unmet=self.when_unmet,
            when_exhausted=self.when_exhausted,
            required_input_pattern=self.required_input_pattern,
            forbidden_input_pattern=self.forbidden_input_pattern,
            max_attempts=self.options.max_attempts,
            base_delay=self.options.base_delay,
            timeout=self.options.timeout,
            start_delay=self.options.start_delay,
            max_in_flight=self.options.max_in_flight,
            rate_limit=self.options.rate_limit,
            rate_period=self.options.rate_period,
            concurrency_key=self.options.concurrency_key,
            concurrency_limit=self.options.concurrency_limit,
            # Always for a signal step ({}: any JSON), so that a schema removed from the spec
            # is removed from the database too.
            payload_schema=(self.payload_schema or {}) if self.is_signal else None,
            subflow_slug=self.subflow_slug,
        )

    @property
    def is_signal(self) -> bool:
        """A signal step runs no task: no handler, no worker, no queue."""
        return self.step_type == "signal"

    @property
    def is_subflow(self) -> bool:
        """A subflow step's tasks are runs of another flow: no handler, no worker, no queue."""
        return self.subflow_slug is not None

    @property
    def runs_handler(self) -> bool:
        """Whether a worker runs this step's tasks (every step but signal and subflow steps)."""
        return not (self.is_signal or self.is_subflow)


CatchUp = Literal["none", "latest", "all"]


@dataclass(frozen=True)
class Schedule:
    """A periodic run of a flow (its spec's `schedules`): the workers start one run per slot of
    `cron` (five fields, or six with the seconds last) read in `timezone`, with `input`;
    `catch_up` decides what happens to slots missed while no worker ran (docs/schedules.md);
    its runs have `priority` (engine 0031, docs/starting-runs.md)."""

    name: str
    cron: str
    input: Any = field(default_factory=dict)
    timezone: str = "UTC"
    catch_up: CatchUp = "none"
    priority: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "input", _frozen(self.input))

    def shape(self) -> dict[str, Any]:
        return shapes.schedule(
            name=self.name, cron=self.cron, input=self.input, timezone=self.timezone,
            catch_up=self.catch_up, priority=self.priority,
        )  # fmt: skip


@dataclass(frozen=True)
class Flow(Generic[StepSlugT, InputT, OutputT, SignalsT]):
    """A concrete flow: slug, options and steps in topological order.

    `StepSlugT` is the Literal union of its step slugs, `InputT` and `OutputT` its run types,
    `SignalsT` its generated `Signals` (`signals`), when it has signal steps.
    """

    slug: str
    steps: tuple[Step, ...] = ()
    options: FlowOptions = field(default_factory=FlowOptions)
    #: The run input's type (the generated `Input`), used to validate inputs before a run starts.
    input_type: object = field(default=None, compare=False)
    #: The input's JSON Schema as the spec declares it: stored with the flow when it is compiled,
    #: so `pgflow-gen start` can check inputs too; read-only.
    input_schema: Mapping[str, Any] | None = field(default=None, compare=False)
    #: Its signal steps, typed by their payloads (the generated `Signals()`).
    signals: SignalsT = field(default=cast(Any, None), compare=False)
    #: Its periodic runs, stored with the flow when it is compiled (engine 0017).
    schedules: tuple[Schedule, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))
        object.__setattr__(self, "schedules", tuple(self.schedules))
        if self.input_schema is not None:
            object.__setattr__(self, "input_schema", _frozen(self.input_schema))
        naming.check_flow_slug(self.slug)
        naming.check_step_slugs(self.slug, [step.slug for step in self.steps])

    @property
    def step_order(self) -> tuple[str, ...]:
        return tuple(step.slug for step in self.steps)

    @property
    def handled_steps(self) -> tuple[str, ...]:
        """The steps whose tasks workers run, in step order: every step but the signal and
        subflow steps."""
        return tuple(step.slug for step in self.steps if step.runs_handler)

    def step(self, slug: str) -> Step:
        """The step of that slug; KeyError when there is none."""
        for step in self.steps:
            if step.slug == slug:
                return step
        raise KeyError(slug)

    def shape(self) -> dict[str, Any]:
        """The complete shape for `pgflow.ensure_flow_compiled` (options included, not compared)."""
        return shapes.flow(
            [step.shape() for step in self.steps],
            max_attempts=self.options.max_attempts,
            base_delay=self.options.base_delay,
            timeout=self.options.timeout,
            input_schema=self.input_schema,
            schedules=[schedule.shape() for schedule in self.schedules],
        )

    def shape_json(self) -> str:
        return json.dumps(self.shape(), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class StepQueuedFlow(Generic[StepSlugT, InputT, OutputT]):
    """A flow whose every step has a private queue; build it with `with_step_queues`."""

    flow: Flow[StepSlugT, InputT, OutputT]
    routes: tuple[naming.Route, ...]

    @property
    def slug(self) -> str:
        return self.flow.slug

    def route(self, step_slug: str) -> naming.Route:
        for route in self.routes:
            if route.step_slug == step_slug:
                return route
        valid = ", ".join(route.step_slug for route in self.routes)
        raise naming.FlowSpecError(
            f'Flow "{self.flow.slug}" has no step "{step_slug}".',
            hint=f"Valid step slugs: {valid}.",
            flow_slug=self.flow.slug,
            step_slug=step_slug,
        )

    def route_map(self) -> list[dict[str, str]]:
        """The route map for `pgflow.ensure_flow_compiled`, in step order."""
        return naming.route_map(self.routes)


def with_step_queues(
    flow: Flow[StepSlugT, InputT, OutputT],
) -> StepQueuedFlow[StepSlugT, InputT, OutputT]:
    """Give every step of `flow` a private queue; raises the typed naming errors right away."""
    routes = naming.resolve_queue_routes(flow.slug, flow.step_order, "step")
    return StepQueuedFlow(flow=flow, routes=routes)

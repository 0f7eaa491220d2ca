"""Slug rules and queue routes: the one Python source of truth, mirrored by the SQL engine.

A flow in queue mode ``flow`` routes every step to its default queue ``lower(flow_slug)``. A flow in
queue mode ``step`` gives each step a private queue: ``lower(flow__step)`` when that fits PGMQ's
47-character limit, else ``lower(flow__<step index>)``, else the flow is rejected. Names are never
truncated or hashed. ``tests/vectors/queue_names.json`` pins these rules for Python and SQL alike.

>>> resolve_queue_routes("communityThreadsV1", ["classify"], "step")
(Route(step_slug='classify', step_index=0, queue_name='communitythreadsv1__classify'),)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from pgflow_gen.errors import PgflowError, excerpt

MAX_PGMQ_QUEUE_NAME_LENGTH = 47
MAX_SLUG_LENGTH = 128
RESERVED_SLUGS = frozenset({"run"})
QUEUE_SEPARATOR = "__"

QueueMode = Literal["flow", "step"]
QUEUE_MODES: tuple[QueueMode, ...] = ("flow", "step")

_SLUG_CHARACTERS = re.compile(r"[A-Za-z0-9_]+")
SLUG_HINT = (
    "Use 1-128 ASCII letters, digits and single underscores, starting with a letter and not"
    ' ending with "_", for example "greetUser" or "greet_user".'
)


class FlowSpecError(PgflowError):
    """Base of every error about a flow definition: a code, a message, a detail and a hint, and
    where it applies the flow, step and step index."""

    code: ClassVar[str] = "flow_spec_error"

    def __init__(
        self,
        message: str,
        *,
        detail: str | None = None,
        hint: str | None = None,
        flow_slug: str | None = None,
        step_slug: str | None = None,
        step_index: int | None = None,
    ) -> None:
        super().__init__(message, detail=detail, hint=hint)
        self.flow_slug = flow_slug
        self.step_slug = step_slug
        self.step_index = step_index


class InvalidSlugError(FlowSpecError):
    code = "invalid_slug"


class DuplicateStepSlugError(FlowSpecError):
    code = "duplicate_step_slug"


class EmptyStepQueuedFlowError(FlowSpecError):
    code = "empty_step_queued_flow"


class DuplicateQueueRouteError(FlowSpecError):
    code = "duplicate_queue_name"


class QueueNameLengthError(FlowSpecError):
    """A required queue name exceeds PGMQ's limit; carries both candidate names and lengths."""

    def __init__(
        self,
        message: str,
        *,
        detail: str,
        hint: str,
        flow_slug: str,
        step_slug: str | None,
        step_index: int,
        readable_name: str | None,
        fallback_name: str,
    ) -> None:
        super().__init__(
            message,
            detail=detail,
            hint=hint,
            flow_slug=flow_slug,
            step_slug=step_slug,
            step_index=step_index,
        )
        self.readable_name = readable_name
        self.fallback_name = fallback_name
        self.readable_length = None if readable_name is None else len(readable_name)
        self.fallback_length = len(fallback_name)
        self.max_length = MAX_PGMQ_QUEUE_NAME_LENGTH


class FlowQueueNameError(QueueNameLengthError):
    code = "flow_queue_name_too_long"


class StepQueueNameError(QueueNameLengthError):
    code = "step_queue_name_too_long"


@dataclass(frozen=True)
class Route:
    """Where one step's tasks are queued."""

    step_slug: str
    step_index: int
    queue_name: str


def slug_violation(slug: str) -> str | None:
    """Why `slug` breaks the slug rules, or None when it is valid."""
    if not slug:
        return "it is empty"
    if len(slug) > MAX_SLUG_LENGTH:
        return f"it has {len(slug)} characters; at most {MAX_SLUG_LENGTH} are allowed"
    if not _SLUG_CHARACTERS.fullmatch(slug):
        return "only ASCII letters, digits and underscores are allowed"
    if not slug[0].isalpha():
        return "it must start with a letter"
    if slug.endswith("_"):
        return "it must not end with an underscore"
    if QUEUE_SEPARATOR in slug:
        return '"__" is reserved as the separator of generated queue names'
    if slug in RESERVED_SLUGS:
        return f'"{slug}" is a reserved word'
    return None


def is_valid_slug(slug: str) -> bool:
    """Whether `slug` is a valid flow or step slug.

    >>> is_valid_slug("greetUser"), is_valid_slug("greet__user")
    (True, False)
    """
    return slug_violation(slug) is None


def check_flow_slug(flow_slug: str) -> None:
    """Raise InvalidSlugError when `flow_slug` is not a valid slug."""
    violation = slug_violation(flow_slug)
    if violation is not None:
        raise InvalidSlugError(
            f'Invalid flow slug "{excerpt(flow_slug)}".',
            detail=f"The slug is invalid: {violation}.",
            hint=SLUG_HINT,
            flow_slug=flow_slug,
        )


def check_step_slugs(flow_slug: str, step_slugs: Sequence[str]) -> None:
    """Raise for an invalid step slug, or two step slugs that differ only in case."""
    errors = step_slug_errors(flow_slug, step_slugs)
    if errors:
        raise errors[0]


def slug_errors(flow_slug: str, step_slugs: Sequence[str]) -> list[FlowSpecError]:
    """Every broken slug rule of a flow, the flow slug first (the spec validator reports all)."""
    errors: list[FlowSpecError] = []
    try:
        check_flow_slug(flow_slug)
    except InvalidSlugError as error:
        errors.append(error)
    return errors + step_slug_errors(flow_slug, step_slugs)


def step_slug_errors(flow_slug: str, step_slugs: Sequence[str]) -> list[FlowSpecError]:
    """An error for every invalid step slug and every slug that repeats an earlier one."""
    errors: list[FlowSpecError] = []
    seen: dict[str, tuple[int, str]] = {}
    for index, step_slug in enumerate(step_slugs):
        violation = slug_violation(step_slug)
        if violation is not None:
            errors.append(
                InvalidSlugError(
                    f'Invalid step slug "{excerpt(step_slug)}" in flow "{excerpt(flow_slug)}".',
                    detail=f"The slug is invalid: {violation}.",
                    hint=SLUG_HINT,
                    flow_slug=flow_slug,
                    step_slug=step_slug,
                    step_index=index,
                )
            )
            continue
        key = step_slug.lower()
        if key in seen:
            first_index, first = seen[key]
            errors.append(
                DuplicateStepSlugError(
                    f'Step slug "{step_slug}" duplicates "{first}" in flow "{flow_slug}".',
                    detail=(
                        f"Step slugs must be unique ignoring case; steps {first_index} and"
                        f' {index} both normalize to "{key}".'
                    ),
                    hint="Rename one of the steps.",
                    flow_slug=flow_slug,
                    step_slug=step_slug,
                    step_index=index,
                )
            )
            continue
        seen[key] = (index, step_slug)
    return errors


def default_queue_name(flow_slug: str) -> str:
    """The queue of every step of a flow-mode flow.

    >>> default_queue_name("communityThreadsV1")
    'communitythreadsv1'
    """
    return flow_slug.lower()


def pgmq_table(queue_name: str, kind: Literal["q", "a"] = "q") -> str:
    """The table PGMQ keeps a queue's messages in (`q`) or its archive (`a`), in schema `pgmq`.
    The one place in Python that spells it; `pgflow.pgmq_table_name` is its SQL twin.

    >>> pgmq_table("communityThreadsV1__classify"), pgmq_table("greetUser", "a")
    ('q_communitythreadsv1__classify', 'a_greetuser')
    """
    return f"{kind}_{queue_name}".lower()


def pgmq_insert_channel(queue_name: str) -> str:
    """The channel PGMQ notifies on for each insert into a queue (once enabled for it).

    >>> pgmq_insert_channel("greetUser")
    'pgmq.q_greetuser.INSERT'
    """
    return f"pgmq.{pgmq_table(queue_name)}.INSERT"


def route_map(routes: Sequence[Route]) -> list[dict[str, str]]:
    """Routes in the JSON form `pgflow.ensure_flow_compiled` takes, in step order."""
    return [{"stepSlug": r.step_slug, "queueName": r.queue_name} for r in routes]


def resolve_queue_routes(
    flow_slug: str, step_slugs: Sequence[str], queue_mode: QueueMode
) -> tuple[Route, ...]:
    """The queue of every step, in step order; raises a FlowSpecError subclass when impossible."""
    if queue_mode not in QUEUE_MODES:
        raise FlowSpecError(
            f'Unknown queue mode "{queue_mode}" for flow "{flow_slug}".',
            hint='Use "flow" (one queue for the flow) or "step" (a private queue per step).',
            flow_slug=flow_slug,
        )
    check_flow_slug(flow_slug)
    check_step_slugs(flow_slug, step_slugs)
    if queue_mode == "flow":
        return _flow_mode_routes(flow_slug, step_slugs)
    return _step_mode_routes(flow_slug, step_slugs)


def _flow_mode_routes(flow_slug: str, step_slugs: Sequence[str]) -> tuple[Route, ...]:
    queue = default_queue_name(flow_slug)
    if len(queue) > MAX_PGMQ_QUEUE_NAME_LENGTH:
        raise FlowQueueNameError(
            f'Flow "{flow_slug}" cannot use its default queue.',
            detail=(
                f'The queue "{queue}" is {len(queue)} characters;'
                f" PGMQ allows at most {MAX_PGMQ_QUEUE_NAME_LENGTH}."
            ),
            hint="Shorten the concrete flow slug.",
            flow_slug=flow_slug,
            step_slug=None,
            step_index=0,
            readable_name=None,
            fallback_name=queue,
        )
    return tuple(Route(slug, index, queue) for index, slug in enumerate(step_slugs))


def _step_mode_routes(flow_slug: str, step_slugs: Sequence[str]) -> tuple[Route, ...]:
    if not step_slugs:
        raise EmptyStepQueuedFlowError(
            f'Flow "{flow_slug}" has no steps, so it cannot use per-step queues.',
            hint="Add at least one step, or use the default single queue.",
            flow_slug=flow_slug,
        )
    shortest = _queue_name(flow_slug, "0")
    if len(shortest) > MAX_PGMQ_QUEUE_NAME_LENGTH:
        raise FlowQueueNameError(
            f'Flow "{flow_slug}" cannot use per-step queues.',
            detail=(
                f'The shortest required queue "{shortest}" is {len(shortest)} characters;'
                f" PGMQ allows at most {MAX_PGMQ_QUEUE_NAME_LENGTH}."
            ),
            hint="Shorten the concrete flow slug or use the default single queue.",
            flow_slug=flow_slug,
            step_slug=step_slugs[0],
            step_index=0,
            readable_name=_queue_name(flow_slug, step_slugs[0]),
            fallback_name=shortest,
        )
    routes: list[Route] = []
    owners: dict[str, str] = {}
    for index, step_slug in enumerate(step_slugs):
        readable = _queue_name(flow_slug, step_slug)
        fallback = _queue_name(flow_slug, str(index))
        if len(readable) <= MAX_PGMQ_QUEUE_NAME_LENGTH:
            queue = readable
        elif len(fallback) <= MAX_PGMQ_QUEUE_NAME_LENGTH:
            queue = fallback
        else:
            raise StepQueueNameError(
                f'Cannot derive a queue for step "{step_slug}" at index {index}'
                f' in flow "{flow_slug}".',
                detail=(
                    f"The readable name is {len(readable)} characters and the index fallback is"
                    f" {len(fallback)}; PGMQ allows at most {MAX_PGMQ_QUEUE_NAME_LENGTH}."
                ),
                hint=(
                    "Shorten the concrete flow slug, shorten the step slug enough for the readable"
                    " name, or use the default single queue."
                ),
                flow_slug=flow_slug,
                step_slug=step_slug,
                step_index=index,
                readable_name=readable,
                fallback_name=fallback,
            )
        if queue in owners:
            raise DuplicateQueueRouteError(
                f'Steps "{owners[queue]}" and "{step_slug}" of flow "{flow_slug}"'
                f' would share the queue "{queue}".',
                detail="Every step of a step-queued flow needs a queue of its own.",
                hint="Rename one of the steps.",
                flow_slug=flow_slug,
                step_slug=step_slug,
                step_index=index,
            )
        owners[queue] = step_slug
        routes.append(Route(step_slug, index, queue))
    return tuple(routes)


def _queue_name(flow_slug: str, suffix: str) -> str:
    return f"{flow_slug}{QUEUE_SEPARATOR}{suffix}".lower()

"""The flow shape: the structure `pgflow.ensure_flow_compiled` compares, built in one place for
the runtime (workers send it) and the code generator (flow migrations embed it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def pattern(value: Mapping[str, Any] | None) -> dict[str, Any]:
    """A condition pattern: SQL NULL (absent) and JSON null stay distinguishable."""
    return {"defined": False} if value is None else {"defined": True, "value": plain(value)}


def step(
    *,
    slug: str,
    step_type: str,
    dependencies: Sequence[str],
    when_unmet: str,
    when_exhausted: str,
    required_input_pattern: Mapping[str, Any] | None,
    forbidden_input_pattern: Mapping[str, Any] | None,
    max_attempts: int | None = None,
    base_delay: int | None = None,
    timeout: int | None = None,
    start_delay: int | None = None,
    max_in_flight: int | None = None,
    rate_limit: int | None = None,
    rate_period: int | None = None,
    concurrency_key: str | None = None,
    concurrency_limit: int | None = None,
    payload_schema: Mapping[str, Any] | None = None,
    subflow_slug: str | None = None,
) -> dict[str, Any]:
    """One step of the shape; options only when set (they are not compared), its limits among
    them (engine 0017) and its concurrency key (engine 0018), and a signal step's payload schema
    (stored with the flow since engine 0011, not compared), and a subflow step's flow (engine
    0028, compared)."""
    options: dict[str, Any]
    options = {
        key: value
        for key, value in (
            ("maxAttempts", max_attempts),
            ("baseDelay", base_delay),
            ("timeout", timeout),
            ("startDelay", start_delay),
            ("maxInFlight", max_in_flight),
            ("rateLimit", rate_limit),
            ("ratePeriod", rate_period),
            ("concurrencyKey", concurrency_key),
            ("concurrencyLimit", concurrency_limit),
        )
        if value is not None
    }
    return {
        "slug": slug,
        "stepType": step_type,
        "dependencies": sorted(dependencies),
        "whenUnmet": when_unmet,
        "whenExhausted": when_exhausted,
        "requiredInputPattern": pattern(required_input_pattern),
        "forbiddenInputPattern": pattern(forbidden_input_pattern),
        **({"options": options} if options else {}),
        **({"payloadSchema": plain(payload_schema)} if payload_schema is not None else {}),
        **({"subflowSlug": subflow_slug} if subflow_slug is not None else {}),
    }


def flow(
    steps: Sequence[dict[str, Any]],
    *,
    max_attempts: int,
    base_delay: int,
    timeout: int,
    input_schema: Mapping[str, Any] | None = None,
    schedules: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The whole shape. The input schema is stored with the flow (engine 0006), and so are its
    schedules (engine 0017), when it has some; neither is compared."""
    return {
        "steps": list(steps),
        "options": {"maxAttempts": max_attempts, "baseDelay": base_delay, "timeout": timeout},
        **({"inputSchema": plain(input_schema)} if input_schema is not None else {}),
        **({"schedules": [plain(s) for s in schedules]} if schedules else {}),
    }


def schedule(
    *, name: str, cron: str, input: Any, timezone: str, catch_up: str, priority: int = 0
) -> dict[str, Any]:
    """One schedule of the shape (engine 0017); its runs' priority only when it has one (engine
    0031), so that the shapes of schedules without one are as they were."""
    return {
        "name": name,
        "cron": cron,
        "timezone": timezone,
        "input": plain(input),
        "catchUp": catch_up,
        **({"priority": priority} if priority else {}),
    }


def plain(value: Any) -> Any:
    """Read-only mappings and tuples back to JSON objects and arrays."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value

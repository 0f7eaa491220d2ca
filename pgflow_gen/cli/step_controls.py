"""A step's pause and limits as the commands read them (`flows`, `limits`, `pause`) and show them,
in a table cell or as JSON."""

from __future__ import annotations

from typing import Any

import psycopg

from pgflow_gen.engine import operator_statements, statements, support
from pgflow_gen.runtime import client as client_module

Pauses = dict[tuple[str, str], dict[str, Any]]


def paused_steps(conn: psycopg.Connection[dict[str, Any]]) -> Pauses:
    """The paused steps by (flow, step), with their reason and since when."""
    return {step_of(r): r for r in conn.execute(operator_statements.STEP_PAUSES)}


Limits = dict[tuple[str, str], dict[str, Any]]


def step_limits(conn: psycopg.Connection[dict[str, Any]]) -> Limits:
    """The limited steps by (flow, step), with their limits and use now, and the keyed ones
    with their keys."""
    usage = statements.step_limit_usage(support.version(conn))
    limits = {step_of(r): r for r in conn.execute(usage, (None,))}
    return client_module.with_concurrency(limits, conn.execute(statements.CONCURRENCY_USAGE))


def limits_json(limits: dict[str, Any] | None) -> dict[str, Any] | None:
    """A step's limits and their use as JSON (None: no limits)."""
    if limits is None:
        return None
    return {
        key: limits[key]
        for key in ("max_in_flight", "in_flight", "rate_limit", "rate_period_s",
                    "window_starts", "set_by", "spec_max_in_flight", "spec_rate_limit",
                    "spec_rate_period_s", "overridden_at", "overridden_by",
                    *client_module.CONCURRENCY_FIELDS)
        if key in limits
    }  # fmt: skip


def limits_cell(limits: dict[str, Any] | None) -> str | None:
    """A step's limits and their use in a few words ("3/4 in flight"; None: no limits)."""
    return None if limits is None else client_module.limits_in_words(limits)


def pause_json(pause: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if pause is None else {"reason": pause["reason"], "paused_at": pause["paused_at"]}


def pause_cell(pause: dict[str, Any] | None) -> str | None:
    if pause is None:
        return None
    return f"paused: {pause['reason']}" if pause["reason"] else "paused"


def step_of(row: dict[str, Any]) -> tuple[str, str]:
    """A row's (flow, step), as pauses and limits are keyed."""
    return row["flow_slug"], row["step_slug"]

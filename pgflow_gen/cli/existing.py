"""What commands check a name against before they act: the compiled flows, a flow's steps or
schedules. A typo is a usage error that names the nearest known name and lists them all."""

from __future__ import annotations

import difflib
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from pgflow_gen.engine import statements
from pgflow_gen.errors import UsageError


def require_flow(conn: psycopg.Connection[Any], flow_slug: str) -> None:
    """Raise UsageError when no flow `flow_slug` is compiled (a typo would look like no data)."""
    with conn.cursor(row_factory=tuple_row) as cursor:
        known = [row[0] for row in cursor.execute(statements.FLOW_SLUGS)]
    if flow_slug in known:
        return
    near = near_match(flow_slug, known)
    listed = f"Compiled flows: {', '.join(known) or '(none)'}." + (
        ""
        if known
        else " A flow is compiled by its generated migration (`pgflow-gen db apply`)"
        " or when its worker starts."
    )
    raise UsageError(
        f'No flow "{flow_slug}" is compiled in this database.',
        hint=f'Did you mean "{near}"? Slugs are exact. {listed}' if near else listed,
    )


def require_member(
    flow_slug: str, kind: str, name: str, known: list[str], exact: str = "Names"
) -> None:
    """Raise UsageError unless `name` is among the flow's `known` ones of `kind` ("step",
    "schedule"), naming a near one and listing them all (`exact`: what is exact, "Slugs")."""
    if name in known:
        return
    near = near_match(name, known)
    listed = f"{kind.capitalize()}s of {flow_slug}: {', '.join(known) or '(none)'}."
    raise UsageError(
        f'Flow "{flow_slug}" has no {kind} "{name}".',
        hint=f'Did you mean "{near}"? {exact} are exact. {listed}' if near else listed,
    )


def near_match(slug: str, known: list[str]) -> str | None:
    """The known slug `slug` is most likely a typo of: the same but for case, else the closest."""
    near = [candidate for candidate in known if candidate.lower() == slug.lower()]
    near = near or difflib.get_close_matches(slug, known, n=1)
    return near[0] if near else None

"""Compiling or verifying a flow in the database before anything runs it: what every worker
does once at startup (and the testing kit before it runs a flow in process); and what a worker
prepares from the flow once: which steps get the run input, and each step's output check."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import psycopg
from psycopg.types.json import Jsonb

from pgflow_gen import shape as shapes
from pgflow_gen.engine import roles, support, worker_statements
from pgflow_gen.naming import QueueMode
from pgflow_gen.runtime import errors, inputs
from pgflow_gen.runtime.flow import Flow
from pgflow_gen.runtime.reconnecting import connection_lost, primary_message


class Compilation(NamedTuple):
    """What compiling a flow did, for the log."""

    #: The engine's status (`compiled`, `verified`, `recompiled`), with what changed when
    #: something did (`verified; options updated: ...`, `recompiled: 6 runs deleted`).
    summary: str
    #: The database kept a newer description of the flow (options, input schema) than this
    #: worker's, an older spec (engine 0009): worth a warning.
    description_kept: bool = False


async def compile_flow(
    conn: psycopg.AsyncConnection[Any],
    flow: Flow[Any, Any, Any],
    queue_mode: QueueMode,
    route_map: Sequence[Mapping[str, str]],
) -> Compilation:
    """Compile `flow` (or check it matches what is compiled) and say what happened. A role
    that may not compile (engine 0019's worker role) only verifies.

    Raises DatabaseError (no engine, an engine older than the support window, a lost
    connection),
    FlowCompilationError (the engine refused the flow), FlowShapeMismatchError or
    FlowRoutingMismatchError (a different flow of that slug is compiled).
    """
    done = "compiled"  # or "verified", by a role that may not compile
    try:
        await support.require_async(conn)
        cursor = await conn.execute(worker_statements.MAY_COMPILE)
        may_compile = await cursor.fetchone()
        if may_compile is not None and not may_compile[0]:
            done = "verified"
        cursor = await conn.execute(
            worker_statements.ENSURE_FLOW_COMPILED
            if done == "compiled"
            else worker_statements.VERIFY_FLOW_COMPILED,
            (flow.slug, Jsonb(flow.shape()), queue_mode, Jsonb(list(route_map))),
        )
    except psycopg.OperationalError as exc:
        if not connection_lost(conn, exc):
            raise errors.FlowCompilationError(
                f'Flow "{flow.slug}" could not be {done}.', detail=primary_message(exc)
            ) from exc
        raise errors.DatabaseError(
            f"The database connection was lost while the flow was being {done}.",
            detail=primary_message(exc),
        ) from exc
    except psycopg.errors.UndefinedFunction as exc:
        raise support.missing_engine_error(str(exc).strip()) from exc
    except psycopg.Error as exc:
        raise errors.FlowCompilationError(
            f'Flow "{flow.slug}" could not be {done}.',
            detail="\n".join(
                part for part in (exc.diag.message_primary, exc.diag.message_detail) if part
            ),
            hint=roles.refusal_hint(exc),
        ) from exc
    row = await cursor.fetchone()
    result: dict[str, Any] = row[0] if row else {}
    status = result.get("status")
    if status == "missing":
        raise errors.FlowCompilationError(
            f'Flow "{flow.slug}" is not compiled in this database, and this worker\'s role may'
            " not compile it.",
            detail="pgflow.ensure_flow_compiled is granted to the admin role only.",
            hint="Apply the flow's migration as an admin first (`pgflow-gen db apply`).",
        )
    if status == "mismatch":
        kind = result.get("mismatchKind")
        error = (
            errors.FlowRoutingMismatchError if kind == "routing" else errors.FlowShapeMismatchError
        )
        raise error(
            f'Flow "{flow.slug}" differs from its definition in the database ({kind}).',
            detail="\n".join(result.get("differences", [])),
            hint="Flows are immutable in production: deploy the change under a new flow slug"
            f" (for example {next_version(flow.slug)}), or run against a local database.",
            flow_slug=flow.slug,
            differences=tuple(result.get("differences", [])),
        )
    # What a person needs to know: "verified", or what changed ("verified; options updated:
    # step \"fetch\" timeout 60 -> 30", "recompiled: 6 runs deleted") since engine 0008.
    return Compilation(str(result.get("summary") or status), bool(result.get("descriptionKept")))


def output_checks(flow: Flow[Any, Any, Any]) -> dict[str, Callable[[Any], list[str]]]:
    """For each step with an output type, what is wrong with an output of its handler."""
    return {
        step.slug: inputs.checker(shapes.plain(step.output_schema))
        for step in flow.steps
        if step.output_schema is not None
    }


def takes_run_input(flow: Flow[Any, Any, Any]) -> frozenset[str]:
    """The steps whose handlers get the run input itself (even a JSON null): root single steps.
    Every other handler gets its task's assembled `input`."""
    return frozenset(
        step.slug for step in flow.steps if step.step_type == "single" and not step.dependencies
    )


def next_version(flow_slug: str) -> str:
    """The slug a changed flow could take: its version suffix counted up, else `V2`.

    >>> next_version("communityThreadsV1"), next_version("e2ePlain")
    ('communityThreadsV2', 'e2ePlainV2')
    """
    found = re.fullmatch(r"(.*?)V(\d+)", flow_slug)
    return f"{found[1]}V{int(found[2]) + 1}" if found else f"{flow_slug}V2"

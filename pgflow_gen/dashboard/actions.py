"""The dashboard's actions (POST): cancel or retry a run, send a signal, pause or resume a step.
Only with actions allowed and a token, with the form's CSRF value; each goes through the
engine's own function, which records it in `pgflow.operator_actions` (engine 0020: the
dashboard's login role as the actor, and the dashboard's label with the client's address beside
it; refused: nothing is recorded), logged, and answered with a redirect to the page it came
from, saying what happened or why the engine refused."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

import psycopg
from psycopg.types.json import Jsonb
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from pgflow_gen.dashboard import pages
from pgflow_gen.engine import client_statements, dashboard_statements, refusals, statements
from pgflow_gen.runtime import errors, sqlstate

log = logging.getLogger("pgflow_gen.dashboard")

Connection = psycopg.AsyncConnection[dict[str, Any]]
Act = Callable[[Connection], Awaitable[str]]


async def cancel(request: Request) -> Response:
    run_id = pages.run_id_of(request)
    form = await _checked_form(request)
    reason = str(form.get("reason") or "").strip() or None

    async def act(conn: Connection) -> str:
        await _one(conn, dashboard_statements.RUN_FLOW, run_id)
        await conn.execute(client_statements.CANCEL_RUN, (run_id, reason))
        return f"Cancelled run {run_id}."

    return await _perform(request, f"/runs/{run_id}", act)


async def retry(request: Request) -> Response:
    run_id = pages.run_id_of(request)
    await _checked_form(request)

    async def act(conn: Connection) -> str:
        await _one(conn, dashboard_statements.RUN_FLOW, run_id)
        await conn.execute(statements.RETRY_RUN, (run_id,))
        return f"Retried run {run_id} from where it failed."

    return await _perform(request, f"/runs/{run_id}", act, refused=refusals.RunNotFailedError)


async def signal(request: Request) -> Response:
    run_id = pages.run_id_of(request)
    form = await _checked_form(request)
    step_slug = str(form.get("step_slug") or "")
    back = f"/runs/{run_id}"
    try:
        payload = json.loads(str(form.get("payload") or ""))
    except json.JSONDecodeError as exc:
        return _back(back, error=f"The payload is not JSON: {exc}.")

    async def act(conn: Connection) -> str:
        await _one(conn, dashboard_statements.RUN_FLOW, run_id)
        await conn.execute(client_statements.SEND_SIGNAL, (run_id, step_slug, Jsonb(payload)))
        return f"Sent the signal of step {step_slug}."

    return await _perform(request, back, act, classify=refusals.signal_error)


async def pause(request: Request) -> Response:
    flow_slug, step_slug = request.path_params["flow_slug"], request.path_params["step_slug"]
    form = await _checked_form(request)
    reason = str(form.get("reason") or "").strip() or None

    async def act(conn: Connection) -> str:
        await conn.execute(client_statements.PAUSE_STEP, (flow_slug, step_slug, reason))
        return f"Paused step {step_slug} of {flow_slug}: none of its tasks starts until resumed."

    return await _perform(request, _came_from(request, "/queues"), act)


async def resume(request: Request) -> Response:
    flow_slug, step_slug = request.path_params["flow_slug"], request.path_params["step_slug"]
    await _checked_form(request)

    async def act(conn: Connection) -> str:
        row = await _one(conn, client_statements.RESUME_STEP, flow_slug, step_slug)
        return (
            f"Resumed step {step_slug} of {flow_slug}: {row['resume_step']} held task(s) can start."
        )

    return await _perform(request, _came_from(request, "/queues"), act)


async def _checked_form(request: Request) -> Any:
    access = request.app.state.access
    if not access.allow_actions:
        raise HTTPException(403, "This dashboard is read-only (start it with --allow-actions).")
    form = await request.form()
    if not access.csrf_matches(str(form.get("csrf") or "")):
        raise HTTPException(403, "The form's CSRF value is missing or wrong; reload the page.")
    return form


async def _perform(
    request: Request,
    back: str,
    act: Act,
    *,
    refused: type[errors.PgflowError] = refusals.RunFinishedError,
    classify: Callable[[psycopg.Error], errors.PgflowError] | None = None,
) -> Response:
    """Run the action in one transaction; log it; redirect back with its outcome."""
    try:
        async with request.app.state.pool.connection() as conn, conn.transaction():
            await conn.execute(statements.SET_ACTION_LABEL, (_actor(request),))
            said = await act(conn)
    except psycopg.Error as exc:
        if sqlstate.classify(None, exc) in (sqlstate.Kind.LOST, sqlstate.Kind.TRANSIENT):
            raise  # the database is unreachable or busy: the error page says so
        error = classify(exc) if classify else refusals.engine_error(exc, refused=refused)
        log.warning("refused %s from %s: %s", request.url.path, _actor(request), error.message)
        return _back(back, error=error.message)
    log.info("%s (by %s)", said, _actor(request))
    return _back(back, done=said)


async def _one(conn: Connection, query: Any, *params: Any) -> dict[str, Any]:
    row = await (await conn.execute(query, params)).fetchone()
    if row is None:
        raise HTTPException(404, "No such run in this database (it may have been pruned).")
    return dict(row)


def _actor(request: Request) -> str:
    """The dashboard and the client's address: the label the engine records beside the login
    role (the address is the peer's, or a forwarded one only behind --forwarded-allow-ips)."""
    client = request.client
    return f"dashboard ({client.host})" if client else "dashboard"


def _came_from(request: Request, default: str) -> str:
    """The page the form was on (its own path, from the form's `back`), else `default`."""
    back = request.query_params.get("back", "")
    return back if back.startswith("/") and not back.startswith("//") else default


def _back(path: str, **outcome: str) -> Response:
    return RedirectResponse(f"{path}?{urlencode(outcome)}", status_code=303)

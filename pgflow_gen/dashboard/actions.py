"""The dashboard's actions (POST): cancel or retry a run, send a signal, pause or resume a step.
Only with actions allowed and a token, with the form's CSRF value; each is the action the
Client and the CLI perform too (`runtime/client/operations`), through the engine's own function,
which records it in `pgflow.operator_actions` (the dashboard's login role as the actor, and the
dashboard's label with the client's address beside it; refused: nothing is recorded), logged,
and answered with a redirect to the page it came from, saying what happened or why the engine
refused."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlencode

import psycopg
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from pgflow_gen.dashboard import pages
from pgflow_gen.engine import refusals
from pgflow_gen.runtime import errors, sqlstate
from pgflow_gen.runtime.client import operations
from pgflow_gen.runtime.client.models import ForkedRun
from pgflow_gen.words import counted

log = logging.getLogger("pgflow_gen.dashboard")

T = TypeVar("T")


async def cancel(request: Request) -> Response:
    run_id = pages.run_id_of(request)
    form = await _checked_form(request)
    reason = str(form.get("reason") or "").strip() or None
    action = operations.cancel_run(run_id, reason)
    return await _perform(request, f"/runs/{run_id}", action, f"Cancelled run {run_id}.")


async def retry(request: Request) -> Response:
    run_id = pages.run_id_of(request)
    await _checked_form(request)
    said = f"Retried run {run_id} from where it failed."
    return await _perform(request, f"/runs/{run_id}", operations.retry_run(run_id), said)


async def fork(request: Request) -> Response:
    """Fork the run from the step the form names; then show the new run."""
    run_id = pages.run_id_of(request)
    form = await _checked_form(request)
    step_slug = str(form.get("from_step") or "")

    def said(forked: ForkedRun) -> str:
        return f"Forked run {run_id} from step {step_slug}: this is the new run."

    action = operations.fork_run(run_id, step_slug)
    return await _perform(
        request, f"/runs/{run_id}", action, said, then=lambda forked: f"/runs/{forked.run_id}"
    )


async def signal(request: Request) -> Response:
    run_id = pages.run_id_of(request)
    form = await _checked_form(request)
    step_slug = str(form.get("step_slug") or "")
    back = f"/runs/{run_id}"
    try:
        payload = json.loads(str(form.get("payload") or ""))
    except json.JSONDecodeError as exc:
        return _back(back, error=f"The payload is not JSON: {exc}.")
    action = operations.send_signal(run_id, step_slug, payload)
    return await _perform(request, back, action, f"Sent the signal of step {step_slug}.")


async def pause(request: Request) -> Response:
    flow_slug, step_slug = request.path_params["flow_slug"], request.path_params["step_slug"]
    form = await _checked_form(request)
    reason = str(form.get("reason") or "").strip() or None
    said = f"Paused step {step_slug} of {flow_slug}: none of its tasks starts until resumed."
    action = operations.pause_step(flow_slug, step_slug, reason)
    return await _perform(request, _came_from(request, "/queues"), action, said)


async def resume(request: Request) -> Response:
    flow_slug, step_slug = request.path_params["flow_slug"], request.path_params["step_slug"]
    await _checked_form(request)

    def said(held: int) -> str:
        return f"Resumed step {step_slug} of {flow_slug}: {counted(held, 'held task')} can start."

    action = operations.resume_step(flow_slug, step_slug)
    return await _perform(request, _came_from(request, "/queues"), action, said)


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
    action: operations.Action[T],
    said: str | Callable[[T], str],
    then: Callable[[T], str] | None = None,
) -> Response:
    """Run the action, labelled as the dashboard's; log it; redirect back with its outcome (or,
    done, to the page `then` names: a fork's new run). A run that is not there is a 404 (it may
    have been pruned); a database that cannot be reached or is busy shows the error page."""
    try:
        async with request.app.state.pool.connection() as conn:
            result = await operations.perform_async(conn, action, label=_actor(request))
    except refusals.RunNotFoundError as error:
        gone = "No such run in this database (it may have been pruned)."
        raise HTTPException(404, gone) from error
    except errors.PgflowError as error:
        cause = error.__cause__
        if isinstance(cause, psycopg.Error) and sqlstate.classify(None, cause) in (
            sqlstate.Kind.LOST,
            sqlstate.Kind.TRANSIENT,
        ):
            raise cause from None
        log.warning("refused %s from %s: %s", request.url.path, _actor(request), error.message)
        return _back(back, error=error.message)
    outcome = said if isinstance(said, str) else said(result)
    log.info("%s (by %s)", outcome, _actor(request))
    return _back(back if then is None else then(result), done=outcome)


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

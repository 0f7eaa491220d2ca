"""The dashboard's pages (GET): overview, runs, one run, queues, workers, and a step's whole
output as JSON. Each reads through data.py and renders one template."""

from __future__ import annotations

import json
import uuid
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from pgflow_gen.dashboard import data, run_view


def render(request: Request, template: str, status_code: int = 200, **context: Any) -> Response:
    state = request.app.state
    response: Response = state.templates.TemplateResponse(
        request,
        template,
        {
            "access": state.access,
            "notice": request.query_params.get("done"),
            "problem": request.query_params.get("error"),
            **context,
        },
        status_code=status_code,
    )
    return response


def run_id_of(request: Request) -> uuid.UUID:
    try:
        return uuid.UUID(request.path_params["run_id"])
    except ValueError:
        raise HTTPException(400, f"Not a run id: {request.path_params['run_id']!r}.") from None


async def overview(request: Request) -> Response:
    async with request.app.state.pool.connection() as conn:
        summary = await data.overview(conn)
    return render(request, "overview.html", page="overview", overview=summary)


async def runs(request: Request) -> Response:
    params = request.query_params
    status = params.get("status") or None
    if status is not None and status not in data.RUN_STATUSES:
        raise HTTPException(400, f"Not a run status: {status!r}.")
    search = (params.get("q") or "").strip() or None
    if search is not None:
        try:
            # A whole run id opens that run; its first characters filter the list.
            return _redirect_to_run(uuid.UUID(search))
        except ValueError:
            if not all(c in "0123456789abcdefABCDEF-" for c in search):
                raise HTTPException(
                    400, f"Search by run id or its first characters, not {search!r}."
                ) from None
    run_filter = data.RunFilter(flow=params.get("flow") or None, status=status, search=search)
    try:
        async with request.app.state.pool.connection() as conn:
            page = await data.runs_page(
                conn, run_filter, older_than=params.get("older"), newer_than=params.get("newer")
            )
    except data.BadCursorError as exc:
        raise HTTPException(400, str(exc)) from None
    return render(request, "runs.html", page="runs", runs=page, statuses=data.RUN_STATUSES)


def _redirect_to_run(run_id: uuid.UUID) -> Response:
    return Response(status_code=303, headers={"location": f"/runs/{run_id}"})


async def run(request: Request) -> Response:
    run_id = run_id_of(request)
    async with request.app.state.pool.connection() as conn:
        detail = await run_view.run_detail(conn, run_id)
    if detail is None:
        raise HTTPException(404, f"No run {run_id} in this database (it may have been pruned).")
    template = "run_live.html" if request.query_params.get("fragment") else "run.html"
    return render(request, template, page="runs", detail=detail)


async def run_input(request: Request) -> Response:
    run_id = run_id_of(request)
    async with request.app.state.pool.connection() as conn:
        found, value = await run_view.run_input(conn, run_id)
    if not found:
        raise HTTPException(404, f"No run {run_id} in this database (it may have been pruned).")
    return Response(json.dumps(value, indent=2, ensure_ascii=False), media_type="application/json")


async def step_output(request: Request) -> Response:
    run_id = run_id_of(request)
    async with request.app.state.pool.connection() as conn:
        output = await run_view.step_output(conn, run_id, request.path_params["step_slug"])
    return Response(json.dumps(output, indent=2, ensure_ascii=False), media_type="application/json")


async def queues(request: Request) -> Response:
    async with request.app.state.pool.connection() as conn:
        found = await data.routes(conn)
    return render(request, "queues.html", page="queues", routes=found)


async def workers(request: Request) -> Response:
    everyone = request.query_params.get("all") == "1"
    async with request.app.state.pool.connection() as conn:
        found = await data.workers(conn, everyone=everyone)
    return render(request, "workers.html", page="workers", workers=found, everyone=everyone)

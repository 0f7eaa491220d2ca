"""The dashboard's ASGI application: routes, the connection pool (opened and closed with the
application), access control, and error pages (a user's mistake is a 4xx page saying what was
wrong; an unreachable database a 503 page; never a traceback)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
import psycopg
import psycopg_pool
from psycopg.rows import dict_row
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from pgflow_gen import errors
from pgflow_gen.dashboard import access as access_module
from pgflow_gen.dashboard import actions, display, live, metrics, pages
from pgflow_gen.runtime import database, sqlstate

log = logging.getLogger("pgflow_gen.dashboard")

POOL_SIZE = 4
POOL_TIMEOUT_S = 10.0
PUBLIC_PREFIXES = ("/static/", "/login")


def create_app(
    database_url: str,
    *,
    access: access_module.Access | None = None,
    pool_size: int = POOL_SIZE,
) -> Starlette:
    """The dashboard for one database, read-only unless `access` allows actions.

    >>> app = create_app("postgresql://localhost/app")  # connects when served
    >>> [route.path for route in app.routes][:3]
    ['/', '/runs', '/runs/{run_id}']
    """
    rules = access or access_module.Access()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        pool: psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[dict[str, Any]]] = (
            psycopg_pool.AsyncConnectionPool(
                database_url,
                min_size=1,
                max_size=pool_size,
                open=False,
                timeout=POOL_TIMEOUT_S,
                kwargs={"autocommit": True, "row_factory": dict_row},
                # A connection the database dropped (a restart) is replaced before a page
                # gets it: the first request after a restart succeeds.
                check=psycopg_pool.AsyncConnectionPool.check_connection,
            )
        )
        await pool.open(wait=True, timeout=POOL_TIMEOUT_S)
        app.state.pool = pool
        events = live.RunEvents(database_url)
        app.state.run_events = events
        listening = asyncio.create_task(events.run(), name="live updates")
        try:
            yield
        finally:
            listening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listening
            await pool.close()

    app = Starlette(
        routes=[
            Route("/", pages.overview),
            Route("/runs", pages.runs),
            Route("/runs/{run_id}", pages.run),
            Route("/runs/{run_id}/events", live.run_events),
            Route("/runs/{run_id}/input", pages.run_input),
            Route("/runs/{run_id}/steps/{step_slug}/output", pages.step_output),
            Route("/queues", pages.queues),
            Route("/workers", pages.workers),
            Route("/metrics", _metrics),
            Route("/login", _login, methods=["GET", "POST"]),
            Route("/runs/{run_id}/cancel", actions.cancel, methods=["POST"]),
            Route("/runs/{run_id}/retry", actions.retry, methods=["POST"]),
            Route("/runs/{run_id}/fork", actions.fork, methods=["POST"]),
            Route("/runs/{run_id}/signal", actions.signal, methods=["POST"]),
            Route("/flows/{flow_slug}/steps/{step_slug}/pause", actions.pause, methods=["POST"]),
            Route("/flows/{flow_slug}/steps/{step_slug}/resume", actions.resume, methods=["POST"]),
            Mount("/static", StaticFiles(packages=[("pgflow_gen.dashboard", "static")])),
        ],
        middleware=[Middleware(BaseHTTPMiddleware, dispatch=_guard)],
        exception_handlers={
            HTTPException: _http_error,
            psycopg.Error: _database_error,
            psycopg_pool.PoolTimeout: _database_error,
            errors.DatabaseError: _engine_error,
            Exception: _internal_error,
        },
        lifespan=lifespan,
    )
    app.state.access = rules
    app.state.sign_ins = access_module.Throttle()
    app.state.database_url = database_url
    app.state.templates = Jinja2Templates(env=environment())
    return app


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("pgflow_gen.dashboard", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        when=display.when, ago=display.ago, duration=display.duration, seconds=display.seconds,
        count=display.count,
    )  # fmt: skip
    return env


async def _guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    """Every page but the public ones needs the token, when there is one. A response says how
    long the application took for it (`Server-Timing`, shown by a browser's developer tools)."""
    rules: access_module.Access = request.app.state.access
    path = request.url.path
    if not rules.host_allowed(request):
        log.warning("refused a request for host %r", request.headers.get("host", ""))
        return PlainTextResponse(
            "This dashboard does not answer to that host name (start it with --allowed-host"
            " NAME to add one).\n",
            status_code=400,
        )
    throttled = _throttled(request)
    if throttled is not None and (
        request.headers.get("authorization") or "token" in request.query_params
    ):
        return throttled
    if rules.allows(request) or path.startswith(PUBLIC_PREFIXES):
        started = time.perf_counter()
        response = await call_next(request)
        response.headers["server-timing"] = f"app;dur={1000 * (time.perf_counter() - started):.1f}"
        return response
    given = request.query_params.get("token")
    if given is not None and rules.token_matches(given):
        # A link with the token signs in once; the address bar keeps no token.
        kept = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "token"])
        response = RedirectResponse(path + (f"?{kept}" if kept else ""), status_code=303)
        _set_session(request, response, rules)
        return response
    if given is not None or request.headers.get("authorization"):
        _failed(request)  # a wrong token, counted against its address
    if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
        return RedirectResponse(f"/login?next={quote(path)}", status_code=303)
    return PlainTextResponse("This dashboard needs its token.\n", status_code=401,
                             headers={"www-authenticate": "Bearer"})  # fmt: skip


async def _login(request: Request) -> Response:
    rules: access_module.Access = request.app.state.access
    target = request.query_params.get("next", "/")
    if not target.startswith("/") or target.startswith("//"):
        target = "/"
    if request.method == "POST":
        throttled = _throttled(request)
        if throttled is not None:
            return throttled
        form = await request.form()
        if rules.token_matches(str(form.get("token") or "")):
            response = RedirectResponse(target, status_code=303)
            _set_session(request, response, rules)
            log.info("signed in from %s", _address(request))
            return response
        _failed(request)
        return pages.render(request, "login.html", status_code=401, page="login", target=target,
                            wrong=True)  # fmt: skip
    return pages.render(request, "login.html", page="login", target=target, wrong=False)


def _set_session(request: Request, response: Response, rules: access_module.Access) -> None:
    response.set_cookie(
        access_module.COOKIE,
        rules.session(),
        max_age=access_module.SESSION_S,
        httponly=True,
        samesite="strict",
        secure=rules.secure_cookie(request),
    )


def _address(request: Request) -> str:
    return request.client.host if request.client else "?"


def _throttled(request: Request) -> Response | None:
    """A 429 while the request's address has sent too many wrong tokens, else None."""
    wait = request.app.state.sign_ins.wait_s(_address(request))
    if wait <= 0:
        return None
    seconds = math.ceil(wait)
    return PlainTextResponse(
        f"Too many wrong tokens from this address: try again in {seconds} s.\n",
        status_code=429,
        headers={"retry-after": str(seconds)},
    )


def _failed(request: Request) -> None:
    address = _address(request)
    request.app.state.sign_ins.failed(address)
    log.warning("a wrong dashboard token from %s", address)


async def _metrics(request: Request) -> Response:
    async with request.app.state.pool.connection() as conn:
        snap = await metrics.snapshot(conn)
    return Response(metrics.exposition(snap), media_type=metrics.CONTENT_TYPE)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if "text/html" not in request.headers.get("accept", ""):
        return PlainTextResponse(f"{exc.detail}\n", status_code=exc.status_code)
    return pages.render(request, "error.html", status_code=exc.status_code, page="error",
                        status=exc.status_code, message=exc.detail)  # fmt: skip


async def _database_error(request: Request, exc: Exception) -> Response:
    """The database could not be reached (or was too busy): 503, try again; anything else it
    refused while reading a page: 500 with its message (an engine older than this dashboard)."""
    text = str(exc).strip()
    reason = database.redact(text.splitlines()[0] if text else type(exc).__name__)
    reachable = isinstance(exc, psycopg.Error) and sqlstate.classify(None, exc) not in (
        sqlstate.Kind.LOST, sqlstate.Kind.TRANSIENT,
    )  # fmt: skip
    if reachable:
        log.error("the database refused a page's statement on %s: %s", request.url.path, reason)
        status, message = 500, f"The database refused a statement of this page: {reason}."
    else:
        log.warning("database unreachable: %s", reason)
        status = 503
        message = f"The database cannot be reached: {reason}. This page tries again when reloaded."
    if "text/html" not in request.headers.get("accept", ""):
        return PlainTextResponse(f"{message}\n", status_code=status)
    return pages.render(request, "error.html", status_code=status, page="error", status=status,
                        message=message)  # fmt: skip


async def _engine_error(request: Request, exc: Exception) -> Response:
    """An engine outside this release's support window (migrated back under a running
    dashboard): 500 saying so and what to do."""
    assert isinstance(exc, errors.DatabaseError)
    log.error("%s on %s", exc.message, request.url.path)
    message = " ".join(part for part in (exc.message, exc.detail, exc.hint) if part)
    if "text/html" not in request.headers.get("accept", ""):
        return PlainTextResponse(f"{message}\n", status_code=500)
    return pages.render(request, "error.html", status_code=500, page="error", status=500,
                        message=message)  # fmt: skip


async def _internal_error(request: Request, exc: Exception) -> Response:
    """A bug: the log has the traceback, the page one line."""
    log.error("internal error on %s", request.url.path, exc_info=exc)
    message = (
        f"Internal error: {type(exc).__name__}. The dashboard's log has the traceback; please"
        " report it."
    )
    if "text/html" not in request.headers.get("accept", ""):
        return PlainTextResponse(f"{message}\n", status_code=500)
    return pages.render(request, "error.html", status_code=500, page="error", status=500,
                        message=message)  # fmt: skip

"""`pgflow-gen dashboard` (the web pages, read-only unless `--allow-actions`) and `pgflow-gen
metrics [--serve]` (the engine's Prometheus metrics, printed once or served). Both need the
`dashboard` extra (Starlette and uvicorn), imported only when one of them runs, so the rest of
the command line works without it.

Binding to anything but loopback needs a token, and so do actions; the token comes from
`--token` or, better (a command line is visible to every user of the machine),
`PGFLOW_DASHBOARD_TOKEN`.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import socket
import sys
from typing import TYPE_CHECKING, Any

from pgflow_gen.cli import connecting
from pgflow_gen.cli import parser as cli_parser
from pgflow_gen.cli.exits import EXIT_OK
from pgflow_gen.errors import UsageError
from pgflow_gen.runtime import errors

if TYPE_CHECKING:
    from starlette.applications import Starlette

TOKEN_VARIABLE = "PGFLOW_DASHBOARD_TOKEN"
LOOPBACK_NAMES = ("localhost",)


def register(commands: cli_parser.Commands) -> None:
    """Add `dashboard` and `metrics` to the `pgflow-gen` parser."""
    dashboard = commands.add(
        "dashboard", "serve the web dashboard (read-only unless --allow-actions)", database=True
    )
    _listen_arguments(dashboard, 8080)
    dashboard.add_argument(
        "--token",
        help=f"the token every page then needs (default: ${TOKEN_VARIABLE}); required to listen"
        " beyond loopback and for actions",
    )
    dashboard.add_argument(
        "--allow-actions",
        action="store_true",
        help="show cancel, retry, pause, resume and signal buttons (needs a token)",
    )
    dashboard.set_defaults(handler=_dashboard)

    metrics = commands.add(
        "metrics", "print the engine's Prometheus metrics once, or serve them", database=True
    )
    metrics.add_argument(
        "--serve", action="store_true", help="serve them at /metrics instead of printing them"
    )
    _listen_arguments(metrics, 9464)
    metrics.add_argument(
        "--token",
        help=f"the bearer token a scrape of --serve needs (default: ${TOKEN_VARIABLE})",
    )
    metrics.set_defaults(handler=_metrics)


def _listen_arguments(command: argparse.ArgumentParser, port: int) -> None:
    command.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    command.add_argument("--port", type=int, default=port, help="the port to listen on")
    command.add_argument(
        "--allowed-host",
        metavar="NAME",
        action="append",
        default=[],
        help="a host name the pages answer to without a token, besides loopback and --host"
        " (repeatable)",
    )
    command.add_argument(
        "--forwarded-allow-ips",
        metavar="ADDRESSES",
        help="trust X-Forwarded-For and X-Forwarded-Proto from these proxies (comma-separated"
        " addresses or networks, as uvicorn takes them); by default no forwarded header is"
        " trusted, so the recorded client address is the peer's",
    )


def _hosts(args: argparse.Namespace) -> frozenset[str]:
    """The names an open dashboard answers to besides loopback: --host and --allowed-host."""
    return frozenset(name.strip("[]").lower() for name in [args.host, *args.allowed_host])


def _dashboard(args: argparse.Namespace) -> int:
    token = _token(args)
    _check_exposure(args.host, token, "the dashboard")
    if args.allow_actions and not token:
        raise UsageError(
            "--allow-actions needs a token, so that not anyone who reaches the page can act.",
            hint=f"Set {TOKEN_VARIABLE} (or pass --token) to a long random value.",
        )
    modules = _extra()
    url = connecting.database_url(args.database_url)
    _check_database(args)
    access = modules.access.Access(
        token=token,
        allow_actions=args.allow_actions,
        hosts=_hosts(args),
        behind_proxy=args.forwarded_allow_ips is not None,
    )
    app = modules.app.create_app(url, access=access)
    mode = "actions allowed" if args.allow_actions else "read-only"
    guard = "the token needed" if token else "no token: loopback only"
    _serve(app, args, f"dashboard ({mode}, {guard})")
    return EXIT_OK


def _metrics(args: argparse.Namespace) -> int:
    token = _token(args)
    modules = _extra()
    url = connecting.database_url(args.database_url)
    if not args.serve:
        return asyncio.run(_print_metrics(url, modules))
    _check_exposure(args.host, token, "the metrics")
    _check_database(args)
    app = modules.app.create_app(url, access=modules.access.Access(token=token, hosts=_hosts(args)))
    _serve(app, args, "metrics at /metrics", path="/metrics")
    return EXIT_OK


async def _print_metrics(url: str, modules: Any) -> int:
    import psycopg
    from psycopg.rows import dict_row

    async with await psycopg.AsyncConnection.connect(
        url, autocommit=True, row_factory=dict_row
    ) as conn:
        snap = await modules.metrics.snapshot(conn)
    sys.stdout.write(modules.metrics.exposition(snap).decode())
    return EXIT_OK


def _token(args: argparse.Namespace) -> str | None:
    token: str | None = args.token or os.environ.get(TOKEN_VARIABLE) or None
    if token is not None and len(token) < 8:
        raise UsageError(
            "The token must be at least 8 characters long.",
            hint="For example: export PGFLOW_DASHBOARD_TOKEN=$(openssl rand -hex 16)",
        )
    return token


def _check_exposure(host: str, token: str | None, what: str) -> None:
    if token or _loopback(host):
        return
    raise UsageError(
        f"Listening on {host} would show {what} to anyone who can reach this machine, so it"
        " needs a token.",
        hint=f"Set {TOKEN_VARIABLE} (or pass --token), or listen on 127.0.0.1.",
    )


def _loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _extra() -> Any:
    """The dashboard's modules, or a ConfigError naming the extra to install."""
    try:
        from pgflow_gen.dashboard import access, app, metrics
    except ModuleNotFoundError as exc:
        if exc.name not in ("starlette", "uvicorn", "multipart", "prometheus_client"):
            raise
        raise errors.ConfigError(
            f"The dashboard needs {exc.name}, which is not installed.",
            hint="pip install 'pgflow-gen[dashboard]'",
        ) from None
    return argparse.Namespace(access=access, app=app, metrics=metrics)


def _check_database(args: argparse.Namespace) -> None:
    """Reach the database now, so a wrong URL or an engine outside the support window is one
    error and its hint, not a traceback."""
    with connecting.connect(args):
        pass


def _serve(app: Starlette, args: argparse.Namespace, what: str, path: str = "/") -> None:
    import uvicorn

    host, port = args.host, args.port
    # Bind first: a port in use is one line here, not uvicorn's log and exit.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)  # connections wait from now on, before the address shows
    except OSError as exc:
        sock.close()
        raise errors.ConfigError(
            f"Cannot listen on {host}:{port}: {exc.strerror or exc}.",
            hint="Pick another --port, or stop what listens there.",
        ) from None
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    print(f"{what}: http://{shown}:{sock.getsockname()[1]}{path} (Ctrl-C stops it)", flush=True)
    # Actions, sign-ins and database trouble are logged (the dashboard's logger); requests not.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # Forwarded headers only from the proxies named (uvicorn trusts loopback's by default, so a
    # local request could record any address it liked).
    proxies = args.forwarded_allow_ips
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        proxy_headers=proxies is not None,
        forwarded_allow_ips=proxies or "",
    )
    server = uvicorn.Server(config)
    with sock:
        asyncio.run(server.serve(sockets=[sock]))
    # A signal stopped it. uvicorn raises the signal again once it has shut down, but inside
    # asyncio.run that becomes a KeyboardInterrupt only if the cancellation it asks for lands
    # before the serving task returns; under load it may not, and the command exited 0.
    if server.should_exit:
        raise KeyboardInterrupt

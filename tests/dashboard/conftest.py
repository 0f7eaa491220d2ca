"""The dashboard as users run it: `pgflow-gen dashboard` in its own process against a fresh
database, reached over HTTP; and runs in known states made through the engine's own calls."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import Db, eventually

TOKEN = "s3cret-token-for-tests"


@dataclass
class Response:
    status: int
    body: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Dashboard:
    """A running `pgflow-gen dashboard` process."""

    proc: subprocess.Popen[str]
    url: str
    log_path: Path
    token: str | None = None

    def get(
        self,
        path: str,
        *,
        html: bool = True,
        token: str | None = None,
        cookie: str | None = None,
        host: str | None = None,
    ) -> Response:
        headers = {"accept": "text/html"} if html else {}
        if host:
            headers["host"] = host
        if token:
            headers["authorization"] = f"Bearer {token}"
        if cookie:
            headers["cookie"] = cookie
        return self._send(urllib.request.Request(self.url + path, headers=headers))

    def post(
        self,
        path: str,
        form: dict[str, str],
        *,
        cookie: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        body = urllib.parse.urlencode(form).encode()
        sent = {"content-type": "application/x-www-form-urlencoded", "accept": "text/html"}
        sent.update(headers or {})
        if cookie:
            sent["cookie"] = cookie
        return self._send(urllib.request.Request(self.url + path, data=body, headers=sent))

    @staticmethod
    def _send(request: urllib.request.Request) -> Response:
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            with opener.open(request, timeout=30) as reply:
                return Response(reply.status, reply.read().decode(), dict(reply.headers))
        except urllib.error.HTTPError as error:
            return Response(error.code, error.read().decode(), dict(error.headers))

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                return self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a redirect is an answer the tests look at


def start_dashboard(db_url: str, tmp_path: Path, *args: str, **env: str) -> Dashboard:
    log_path = tmp_path / f"dashboard-{uuid.uuid4().hex[:8]}.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pgflow_gen.cli", "dashboard", "--port", "0",
             "--database-url", db_url, *args],
            stdout=log, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, **env},
        )  # fmt: skip

    def url() -> str | None:
        found = re.search(r"http://127\.0\.0\.1:\d+", log_path.read_text())
        if found is None and proc.poll() is not None:
            raise AssertionError(f"the dashboard exited: {log_path.read_text()}")
        return found[0] if found else None

    return Dashboard(proc, eventually(url, "the dashboard's address"), log_path,
                     env.get("PGFLOW_DASHBOARD_TOKEN"))  # fmt: skip


@pytest.fixture
def start(db_url: str, tmp_path: Path) -> Iterator[Callable[..., Dashboard]]:
    started: list[Dashboard] = []

    def begin(*args: str, **env: str) -> Dashboard:
        dashboard = start_dashboard(db_url, tmp_path, *args, **env)
        started.append(dashboard)
        return dashboard

    yield begin
    for dashboard in started:
        dashboard.stop()


@pytest.fixture
def dashboard(start: Callable[..., Dashboard]) -> Dashboard:
    """A read-only dashboard without a token, on loopback."""
    return start()


@pytest.fixture
def db(db_url: str) -> Iterator[Db]:
    database = Db(db_url)
    yield database
    database.close()


# -- runs in known states ------------------------------------------------------------------------

SHOWCASE = "showcase"


def define_showcase(db: Db) -> None:
    """`fetch`, then `notify` (only when fetch says so, else skipped) and `parse` (one attempt)."""
    db.flow(
        SHOWCASE,
        {"slug": "fetch"},
        {"slug": "notify", "deps_slugs": ["fetch"],
         "required_input_pattern": {"fetch": {"send": True}}},
        {"slug": "parse", "deps_slugs": ["fetch"], "max_attempts": 1},
    )  # fmt: skip


def finished_showcase(db: Db) -> uuid.UUID:
    """A run whose fetch completed, notify was skipped and parse failed (so the run failed)."""
    run_id = db.start(SHOWCASE, {"url": "https://example.com"})
    [fetch] = db.poll(SHOWCASE)
    db.complete(fetch, {"send": False, "text": "<html>"})
    [parse] = db.poll(SHOWCASE)
    db.fail(parse, "ValueError: no table in the page\nTraceback (most recent call last):\n  ...")
    assert db.run(run_id)["status"] == "failed"
    return run_id

"""Live updates under load and abuse (engine integrity, section 8): every open run page's event
stream is fed by one listening connection per dashboard process, only a run that exists gets a
stream, and past the cap a page gets a clear 503 instead of another database connection."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import logging
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator

import pytest

from pgflow_gen.dashboard import live
from tests.dashboard.conftest import Dashboard
from tests.e2e.harness import Db, eventually


class Stream:
    """One open `/runs/<id>/events` stream, read line by line."""

    def __init__(self, dashboard: Dashboard, run_id: uuid.UUID) -> None:
        parts = urllib.parse.urlsplit(dashboard.url)
        self.conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
        self.conn.request("GET", f"/runs/{run_id}/events")
        self.reply = self.conn.getresponse()

    def line(self) -> str:
        return self.reply.readline().decode().rstrip("\n")

    def ready(self) -> None:
        """Read up to the stream's `event: ready` (its run's channel is listened to)."""
        while (line := self.line()) != "event: ready":
            assert line or not self.reply.isclosed(), "the stream ended before it was ready"

    def events(self) -> Iterator[str]:
        while (line := self.line()) or not self.reply.isclosed():
            if line.startswith("data: "):
                yield line[6:]

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def streams() -> Iterator[list[Stream]]:
    opened: list[Stream] = []
    yield opened
    for stream in opened:
        stream.close()


def listening_backends(db: Db) -> int:
    return int(
        db.value(
            "select count(*) from pg_stat_activity where datname = current_database()"
            " and pid <> pg_backend_pid() and query ilike 'listen %%'"
        )
    )


def test_an_unknown_run_has_no_stream(dashboard: Dashboard) -> None:
    reply = dashboard.get(f"/runs/{uuid.uuid4()}/events", html=False)
    assert reply.status == 404
    assert "No such run" in reply.body


def test_streams_share_one_connection_and_the_cap_answers_503(
    dashboard: Dashboard, db: Db, streams: list[Stream]
) -> None:
    db.flow("live", {"slug": "only"})
    runs = [db.start("live", {"n": n}) for n in range(live.MAX_STREAMS)]
    for run_id in runs:
        stream = Stream(dashboard, run_id)
        streams.append(stream)
        assert (stream.reply.status, stream.line()) == (200, "retry: 2000")
    for stream in streams:
        stream.ready()
    eventually(lambda: listening_backends(db) == 1, "one listening connection for all streams")

    refused = dashboard.get(f"/runs/{runs[0]}/events", html=False)
    assert refused.status == 503
    assert f"already follows {live.MAX_STREAMS} live pages" in refused.body

    # The streams still carry their runs' events, each to its own page, to the final one.
    claimed = db.poll("live", qty=2)
    assert sorted(t.run_id for t in claimed) == sorted(runs[:2])
    for task in claimed:
        db.complete(task, "done", fenced=True)
    for stream in streams[:2]:
        events = list(stream.events())
        assert any('"run:completed"' in event for event in events), events


def test_a_closed_page_frees_its_place(dashboard: Dashboard, db: Db, streams: list[Stream]) -> None:
    db.flow("live", {"slug": "only"})
    run_id = db.start("live")
    for _ in range(live.MAX_STREAMS):
        streams.append(Stream(dashboard, run_id))
        assert streams[-1].line() == "retry: 2000"
    streams.pop().close()

    def room() -> bool:
        probe = Stream(dashboard, run_id)
        if probe.reply.status == 200:
            streams.append(probe)
            return True
        probe.close()
        return False

    eventually(room, "the closed stream's place to be free")


def test_an_event_right_after_ready_reaches_the_page(
    dashboard: Dashboard, db: Db, streams: list[Stream]
) -> None:
    """The page reads the run when its stream is ready, so nothing may fall between the two:
    an event sent the moment the stream says ready is on the stream. Repeated, since the channel
    is listened to afresh for each new run."""
    db.flow("live", {"slug": "only"})
    for n in range(5):
        run_id = db.start("live", {"n": n})
        stream = Stream(dashboard, run_id)
        streams.append(stream)
        stream.ready()
        [task] = db.poll("live")
        db.complete(task, "done", fenced=True)
        events = list(stream.events())
        assert any('"run:completed"' in event for event in events), events


def test_a_lost_database_is_said_once_and_its_return_once(
    db_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listener retries every RECONNECT_S while the database is away: one warning, the
    retries at DEBUG, one line when it is back (it logged a warning a second)."""
    monkeypatch.setattr(live, "RECONNECT_S", 0.01)
    events = live.RunEvents("postgresql://nobody@127.0.0.1:9/none?connect_timeout=1")
    caplog.set_level(logging.DEBUG, logger="pgflow_gen.dashboard")

    async def scenario() -> None:
        listening = asyncio.create_task(events.run())
        try:
            await poll(lambda: len(retries(caplog)) >= 5, "five retries")
            events.database_url = db_url  # the database is back
            await poll(lambda: any("is back after" in r.message for r in caplog.records), "back")
        finally:
            listening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listening

    asyncio.run(scenario())
    said = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert [r.levelname for r in said] == ["WARNING", "INFO"]
    assert said[0].message.startswith("lost the database connection (live updates): ")
    assert said[1].message.startswith("the database connection is back after ")


def retries(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.DEBUG and "live updates" in r.message]


async def poll(done: Callable[[], bool], what: str, deadline_s: float = 30.0) -> None:
    end = time.monotonic() + deadline_s
    while not done():
        assert time.monotonic() < end, f"no {what} within {deadline_s} s"
        await asyncio.sleep(0.01)

"""A database connection that comes back: reconnects with backoff after the server goes away,
and says so once per outage (`Outage`), not once per retry of each connection."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar

import psycopg

FIRST_BACKOFF = 0.25
MAX_BACKOFF = 5.0
#: libpq settings for every worker connection: TCP keepalives notice a half-open connection
#: (a dropped NAT entry, a failover without a reset) within about a minute, and a connection
#: attempt gives up after 10 s. Unix-socket connections ignore the keepalive settings.
CONNECT_OPTIONS: dict[str, Any] = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}
# SQLSTATEs that mean the session is gone (class 08, and the server shutting it down).
_LOST_STATES = ("57P01", "57P02", "57P03")


class Connection(Protocol):
    """What a link keeps: a psycopg connection, or a session on one (see `session`)."""

    @property
    def closed(self) -> bool: ...
    @property
    def broken(self) -> bool: ...
    async def close(self) -> None: ...


ConnectionT = TypeVar("ConnectionT", bound=Connection)


def connection_lost(conn: Connection | None, exc: psycopg.Error) -> bool:
    """Whether `exc` lost the connection (reconnect) rather than failed one statement.

    psycopg files many ordinary statement errors (a statement timeout, a value too large, a
    deadlock) under OperationalError too; only a broken session or class 08 means reconnect.
    """
    if conn is not None and (conn.broken or conn.closed):
        return True
    state = exc.sqlstate or ""
    return (
        state.startswith("08")
        or state in _LOST_STATES
        or (not state and isinstance(exc, psycopg.OperationalError))
    )


def primary_message(exc: psycopg.Error) -> str:
    """The error's own message, without PostgreSQL's CONTEXT (which may quote data)."""
    return exc.diag.message_primary or (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class Outage:
    """What a process says when the database goes away and comes back: one warning when the
    first of its connections is lost (or cannot connect), one line when the last one is back,
    with how long it took; every retry in between at DEBUG. A worker's links share one.

    A connection found dead soon after an outage ended (an idle one, noticed at its next use)
    reconnects quietly, unless it cannot connect: then it is a new outage, and said.
    """

    #: How long after an outage a connection found dead belongs to it.
    AFTERMATH_S = 60.0

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._down: set[str] = set()
        self._since = 0.0
        self._said = False
        self._ended_at: float | None = None

    def down(self, purpose: str, reason: str, retry_in: float | None = None) -> None:
        """`purpose`'s connection is lost (`retry_in` None) or cannot be made (`reason`)."""
        now = time.monotonic()
        if not self._down:
            self._since = now
        self._down.add(purpose)
        aftermath = self._ended_at is not None and now - self._ended_at < self.AFTERMATH_S
        if not self._said and (retry_in is not None or not aftermath):
            self._said = True
            self._log.warning(
                "lost the database connection (%s): %s; retrying until it is back",
                purpose,
                reason,
            )
        else:
            self._log.debug(
                "database connection down for %s (%s); retrying in %s s", purpose, reason, retry_in
            )

    def back(self, purpose: str) -> None:
        """`purpose` is connected again."""
        if purpose not in self._down:
            return
        self._down.discard(purpose)
        if self._down:
            return
        now = time.monotonic()
        self._ended_at = now
        if self._said:
            self._said = False
            self._log.info("the database connection is back after %.1f s", now - self._since)
        else:
            self._log.debug("reconnected (%s)", purpose)


class Link(Generic[ConnectionT]):
    """One connection, opened by `connect` and reopened on demand after `broken()`.

    `on_connect` runs on every new connection (a worker re-registers, a listener re-listens);
    `on_reconnect` is told each time a connection replaces a lost one (the worker's metrics).
    `outage` says when the database goes and comes back (shared by a process's links; its own
    otherwise).
    """

    def __init__(
        self,
        connect: Callable[[], Awaitable[ConnectionT]],
        purpose: str,
        logger: logging.Logger,
        on_connect: Callable[[ConnectionT], Awaitable[None]] | None = None,
        on_reconnect: Callable[[str], None] | None = None,
        outage: Outage | None = None,
    ) -> None:
        self._connect = connect
        self._outage = outage or Outage(logger)
        self._on_reconnect = on_reconnect
        self._connected_before = False
        self._purpose = purpose
        self._on_connect = on_connect
        self._conn: ConnectionT | None = None
        self._backoff = FIRST_BACKOFF
        #: Why the last connection attempt or the last connection failed (None: no failure yet).
        self.last_error: str | None = None

    @property
    def current(self) -> ConnectionT | None:
        return self._conn

    async def get(self, give_up: Callable[[], bool] | None = None) -> ConnectionT | None:
        """The open connection, connecting (and retrying with backoff) when there is none.

        Returns None instead of retrying again once `give_up()` is true (a draining worker).
        """
        while self._conn is None or self._conn.closed or self._conn.broken:
            if give_up is not None and give_up():
                return None
            conn: ConnectionT | None = None
            try:
                conn = await self._connect()
                if self._on_connect is not None:
                    await self._on_connect(conn)
            except psycopg.Error as exc:
                if conn is not None:
                    with contextlib.suppress(psycopg.Error):
                        await conn.close()
                self.last_error = _first_line(exc)
                self._outage.down(self._purpose, self.last_error, self._backoff)
                await asyncio.sleep(self._backoff)
                self._backoff = min(self._backoff * 2, MAX_BACKOFF)
                continue
            self._outage.back(self._purpose)
            if self._connected_before and self._on_reconnect is not None:
                self._on_reconnect(self._purpose)
            self._connected_before = True
            self._backoff = FIRST_BACKOFF
            self._conn = conn
        return self._conn

    def adopt(self, conn: ConnectionT) -> None:
        """Use an already open connection (the one the worker started with)."""
        self._conn = conn
        self._connected_before = True

    async def broken(self, exc: BaseException) -> None:
        """Forget the current connection after `exc`; the next `get()` reconnects."""
        self.last_error = _first_line(exc)
        self._outage.down(self._purpose, self.last_error)
        await self.close()

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            with contextlib.suppress(psycopg.Error):
                await conn.close()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

"""The clients' connections: the small pool each keeps for its calls, what a failure to connect
says, and the checks on an application's own connection that a start joins
(`start_flow(..., connection=conn)`)."""

from __future__ import annotations

from typing import Any

import psycopg
import psycopg_pool
from psycopg.pq import TransactionStatus

from pgflow_gen import errors
from pgflow_gen.runtime import database

#: Connections a client keeps at most (opened as calls need them, closed after POOL_IDLE_S idle).
POOL_SIZE = 4
POOL_IDLE_S = 300.0
#: How long a call waits for a pooled connection (the database restarting, every one in use).
POOL_WAIT_S = 10.0
#: What a pool's connections are opened with: autocommit, unprepared (as a connection per call
#: was: safe behind any PgBouncer).
CONNECTION_KWARGS: dict[str, Any] = {"autocommit": True, "prepare_threshold": None}


def check_pool_size(pool_size: int) -> None:
    if pool_size < 1:
        raise errors.ConfigError(
            f"Invalid pool_size={pool_size!r}.", hint="pool_size must be at least 1."
        )


def connect_failed(exc: psycopg.Error) -> Exception:
    """What a client raises when it cannot connect: a bad URL's or a refused login's typed
    error, DatabaseError for a server it cannot reach, anything else as it is."""
    problem = database.config_problem(exc)
    if problem is not None:
        return problem
    if not isinstance(exc, psycopg.OperationalError):
        return exc
    return errors.DatabaseError(
        "Cannot connect to the database.",
        detail=str(exc).strip(),
        hint="Check PGFLOW_DATABASE_URL (or DATABASE_URL) and that PostgreSQL is up.",
    )


def pool_timed_out(exc: psycopg_pool.PoolTimeout) -> errors.DatabaseError:
    return errors.DatabaseError(
        "Cannot connect to the database.",
        detail=f"No connection within {POOL_WAIT_S:g} s: {exc}",
        hint="Check that PostgreSQL is up; the client connects again once it is.",
    )


def check_joinable(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """Raise UsageError unless a start can join `conn`'s transaction: one is open, or opens
    with the next statement (a connection out of autocommit), and has not failed."""
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise errors.UsageError(
            "The connection's transaction has failed already; nothing was started.",
            hint="Roll the transaction back, then start the run in a new one.",
        )
    if status == TransactionStatus.IDLE and conn.autocommit:
        raise errors.UsageError(
            "start_flow(connection=...) needs a transaction to join, and the connection is in"
            " autocommit mode outside one; nothing was started.",
            hint="Start inside `with conn.transaction():` (Django: `transaction.atomic()`), or"
            " leave out `connection=` to start the run in a transaction of its own.",
        )

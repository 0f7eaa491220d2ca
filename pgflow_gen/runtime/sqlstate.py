"""What a failed statement means for the work it carried, by SQLSTATE.

- `LOST`: the connection is gone; reconnect and send the same work again.
- `TRANSIENT`: the statement may well succeed if sent again (a serialization failure, a deadlock,
  a lock or statement timeout, an operator's `pg_cancel_backend`, a server short of connections or
  memory): keep the work and retry after a backoff.
- `REFUSED`: the data or the engine refuses it (class 22 data errors, 23 constraints, 54 limits,
  the engine's own `raise exception`): sending it again cannot help.
- `UNKNOWN`: anything else: keep the work and retry (logged once per episode, as transient
  failures are); it is never dropped on a guess.

>>> classify(None, psycopg.errors.QueryCanceled())
<Kind.TRANSIENT: 'transient'>
>>> classify(None, psycopg.errors.InvalidTextRepresentation())
<Kind.REFUSED: 'refused'>
"""

from __future__ import annotations

import enum

import psycopg

from pgflow_gen.runtime.reconnecting import Connection, connection_lost


class Kind(enum.Enum):
    LOST = "lost"
    TRANSIENT = "transient"
    REFUSED = "refused"
    UNKNOWN = "unknown"


#: (Class 08 and the server ending the session, 57P01-57P03, are LOST: see
#: reconnecting.connection_lost.)
#: Whole classes: 40 transaction rollback (serialization failure 40001, deadlock 40P01), 53
#: insufficient resources (too many connections 53300, out of memory, disk full).
_TRANSIENT_CLASSES = ("40", "53")
_TRANSIENT_STATES = frozenset({
    "55P03",  # lock_not_available: lock_timeout, NOWAIT
    "55006",  # object_in_use
    "57014",  # query_canceled: statement_timeout, pg_cancel_backend
    "58000",  # system_error
    "58030",  # io_error
})  # fmt: skip
#: 22 data exception, 23 integrity constraint violation, 54 program limit exceeded.
_REFUSED_CLASSES = ("22", "23", "54")
_REFUSED_STATES = frozenset({
    "P0001",  # raise_exception: the engine's own refusal
    "P0002",  # no_data_found: the engine has no such run or task
})  # fmt: skip


def classify(conn: Connection | None, exc: psycopg.Error) -> Kind:
    """The kind of `exc`, raised by a statement on `conn` (None: no connection to look at)."""
    if connection_lost(conn, exc):
        return Kind.LOST
    state = exc.sqlstate or ""
    if state[:2] in _TRANSIENT_CLASSES or state in _TRANSIENT_STATES:
        return Kind.TRANSIENT
    if state[:2] in _REFUSED_CLASSES or state in _REFUSED_STATES:
        return Kind.REFUSED
    if not state and isinstance(exc, psycopg.DataError):
        return Kind.REFUSED  # refused before it was sent (a NUL character in a text value)
    return Kind.UNKNOWN

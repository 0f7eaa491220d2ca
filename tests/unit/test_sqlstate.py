"""What a failed statement means for the work it carried (runtime/sqlstate.py)."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors as e

from pgflow_gen.runtime.sqlstate import Kind, classify


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (e.AdminShutdown(), Kind.LOST),
        (e.ConnectionFailure(), Kind.LOST),
        (psycopg.OperationalError("server closed the connection unexpectedly"), Kind.LOST),
        (e.SerializationFailure(), Kind.TRANSIENT),
        (e.DeadlockDetected(), Kind.TRANSIENT),
        (e.LockNotAvailable(), Kind.TRANSIENT),
        (e.QueryCanceled(), Kind.TRANSIENT),
        (e.TooManyConnections(), Kind.TRANSIENT),
        (e.OutOfMemory(), Kind.TRANSIENT),
        (e.InvalidTextRepresentation(), Kind.REFUSED),
        (e.UntranslatableCharacter(), Kind.REFUSED),
        (e.CheckViolation(), Kind.REFUSED),
        (e.ProgramLimitExceeded(), Kind.REFUSED),
        (e.RaiseException(), Kind.REFUSED),
        (e.NoDataFound(), Kind.REFUSED),
        (psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes"), Kind.REFUSED),
        (e.UndefinedFunction(), Kind.UNKNOWN),
        (e.InsufficientPrivilege(), Kind.UNKNOWN),
        (psycopg.InternalError("something new"), Kind.UNKNOWN),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else str(value),
)
def test_each_error_has_its_kind(error: psycopg.Error, kind: Kind) -> None:
    assert classify(None, error) is kind


def test_any_error_on_a_closed_connection_is_a_lost_one() -> None:
    class Closed:
        closed = True
        broken = False

        async def close(self) -> None:
            return None

    assert classify(Closed(), e.QueryCanceled()) is Kind.LOST

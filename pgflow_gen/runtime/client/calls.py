"""A client call written once for both clients: a generator that yields each statement it
needs (a `Query`), is sent the statement's rows back, and returns the call's result. It does no
I/O itself; `run` drives it on a psycopg connection and `run_async` on an async one, so `Client`
and `AsyncClient` send the same statements, read the same rows and raise the same errors.

>>> def twice(n: int) -> Call[int]:
...     rows = yield Query("select %s::int * 2 as n", (n,))
...     return int(rows[0]["n"])

A call's statements run on the connection the driver is given, one after the other; with
`transaction=True` inside one transaction of their own, otherwise in whatever the connection is in
(autocommit: each its own; the caller's open transaction: that one).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, LiteralString, TypeVar

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import JsonbLoader, JsonLoader

from pgflow_gen.engine import refusals
from pgflow_gen.errors import PgflowError

T = TypeVar("T")
Row = dict[str, Any]


@dataclass(frozen=True)
class Query:
    """One statement of a call: `refusal` turns what the engine refuses into the typed error
    the caller sees."""

    sql: LiteralString
    params: tuple[Any, ...]
    refusal: Callable[[psycopg.Error], PgflowError] = refusals.engine_error


#: A call: yields its statements, is sent each one's rows, returns its result.
Call = Generator[Query, list[Row], T]


def run(
    conn: psycopg.Connection[Any],
    call: Call[T],
    *,
    transaction: bool = False,
    own_loaders: bool = False,
) -> T:
    """Drive `call` on `conn`. `own_loaders`: read JSON as JSON whatever loaders the connection
    has (an application's connection may load jsonb as text, as Django's does)."""
    if transaction:
        with conn.transaction():
            return run(conn, call, own_loaders=own_loaders)
    try:
        query = next(call)
        while True:
            try:
                with conn.cursor(row_factory=dict_row) as cur:
                    if own_loaders:
                        _json_loaders(cur)
                    cur.execute(query.sql, query.params)
                    rows = cur.fetchall() if cur.description is not None else []
            except psycopg.Error as exc:
                raise query.refusal(exc) from exc
            query = call.send(rows)
    except StopIteration as done:
        result: T = done.value
        return result


async def run_async(
    conn: psycopg.AsyncConnection[Any],
    call: Call[T],
    *,
    transaction: bool = False,
    own_loaders: bool = False,
) -> T:
    """`run` on an async connection."""
    if transaction:
        async with conn.transaction():
            return await run_async(conn, call, own_loaders=own_loaders)
    try:
        query = next(call)
        while True:
            try:
                async with conn.cursor(row_factory=dict_row) as cur:
                    if own_loaders:
                        _json_loaders(cur)
                    await cur.execute(query.sql, query.params)
                    rows = await cur.fetchall() if cur.description is not None else []
            except psycopg.Error as exc:
                raise query.refusal(exc) from exc
            query = call.send(rows)
    except StopIteration as done:
        result: T = done.value
        return result


def _json_loaders(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> None:
    """This cursor reads json and jsonb as JSON (its own adapters; the connection's stay)."""
    cur.adapters.register_loader("jsonb", JsonbLoader)
    cur.adapters.register_loader("json", JsonLoader)

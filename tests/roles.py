"""Real roles on the tests' server: the engine's group roles under a prefix of this test's own
(roles belong to the whole server, and tests run side by side), login roles in them, and
connections as those logins. Everything is dropped afterwards."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgflow_gen.engine import roles


def login_url(url: str, user: str, password: str, dbname: str | None = None) -> str:
    """`url` as another login role (and, given, in another database)."""
    params = conninfo_to_dict(url)
    params.update(user=user, password=password)
    if dbname is not None:
        params["dbname"] = dbname
    return make_conninfo("", **params)


@dataclass
class Logins:
    """The group roles of one test and a login role in each (`login(kind)` connects)."""

    admin_conn: psycopg.Connection[Any]
    url: str
    prefix: str
    names: roles.RoleNames
    password: str = field(default_factory=lambda: secrets.token_hex(8))
    created: list[str] = field(default_factory=list)
    connections: list[psycopg.Connection[Any]] = field(default_factory=list)

    def create_login(self, role: str, *, member_of: str | None = None) -> str:
        statement = sql.SQL("create role {} login password {}").format(
            sql.Identifier(role), sql.Literal(self.password)
        )
        self.admin_conn.execute(statement)
        self.created.append(role)
        if member_of is not None:
            self.admin_conn.execute(
                sql.SQL("grant {} to {}").format(sql.Identifier(member_of), sql.Identifier(role))
            )
        return role

    def url_of(self, role: str) -> str:
        """The test database's URL as a login role (with its password)."""
        return login_url(self.url, role, self.password)

    def connect(self, role: str) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self.url_of(role), autocommit=True)
        self.connections.append(conn)
        return conn

    def login_role(self, kind: str) -> str:
        """A login role that is a member of the group role `kind`, made on first use."""
        role = f"{self.prefix}_{kind}_login"
        if role not in self.created:
            self.create_login(role, member_of=self.names.of(kind))
        return role

    def login(self, kind: str) -> psycopg.Connection[Any]:
        """A connection as `login_role(kind)`."""
        return self.connect(self.login_role(kind))

    def add_step_roles(self, flow_slug: str) -> list[roles.StepRole]:
        """`db roles --per-step FLOW` applied: one login role per step (with our password)."""
        step_roles = roles.step_roles(self.admin_conn, flow_slug, self.prefix)
        roles.apply(self.admin_conn, roles.step_statements(step_roles, self.names))
        for item in step_roles:
            self.created.append(item.role)
            self.admin_conn.execute(
                sql.SQL("alter role {} password {}").format(
                    sql.Identifier(item.role), sql.Literal(self.password)
                )
            )
        return step_roles


def logins_on(conn: psycopg.Connection[Any], db_url: str) -> Iterator[Logins]:
    """The `logins` fixture's body (tests/conftest.py)."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    names = roles.RoleNames.with_prefix(prefix)
    found = Logins(conn, db_url, prefix, names)
    try:
        roles.apply(conn, roles.group_statements(conn, names))
        found.created.extend(names.of(kind) for kind in reversed(roles.KINDS))
        yield found
    finally:
        for connection in found.connections:
            connection.close()
        for role in reversed(found.created):
            conn.execute(sql.SQL("drop owned by {}").format(sql.Identifier(role)))
        for role in reversed(found.created):
            conn.execute(sql.SQL("drop role {}").format(sql.Identifier(role)))


def refused(conn: psycopg.Connection[Any], query: str, *params: Any) -> str:
    """Run `query`, which the engine must refuse for want of a privilege; its message."""
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as caught:
        conn.execute(query.encode(), params)
    return caught.value.diag.message_primary or ""

"""Who may look and who may act. Without a token every page is open (the dashboard then listens
on loopback only: the CLI refuses anything else). With a token, every page but the login page
and the static files needs it: as `Authorization: Bearer <token>` (scrapers, scripts) or as the
session cookie the login page sets (browsers), which holds an HMAC of the token, never the token.
Actions need `allow_actions` and a token, and every form carries a CSRF value derived from the
token, so another site cannot post one with the operator's cookie.

An open dashboard answers only requests whose `Host` names loopback, the address it listens on,
or a name in `hosts` (`--allowed-host`): a page of another site that re-points its own name at
127.0.0.1 (DNS rebinding) reaches the port, but under its own name, and is refused.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from starlette.requests import Request

COOKIE = "pgflow_dashboard"
#: The names an open dashboard always answers to.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


class AccessError(ValueError):
    """A dashboard configured against these rules (actions without a token)."""


@dataclass(frozen=True)
class Access:
    token: str | None = None
    allow_actions: bool = False
    #: Host names (besides loopback's) an open dashboard answers to.
    hosts: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.allow_actions and not self.token:
            raise AccessError("Actions need a token: pass one, so that not anyone can act.")
        if self.token is not None and len(self.token) < 8:
            raise AccessError("A dashboard token must be at least 8 characters long.")

    @property
    def open(self) -> bool:
        return self.token is None

    def _derive(self, purpose: str) -> str:
        assert self.token is not None
        return hmac.new(self.token.encode(), purpose.encode(), hashlib.sha256).hexdigest()

    def session(self) -> str:
        """The session cookie's value."""
        return self._derive("session")

    def csrf(self) -> str:
        """The value every action form carries ('' when the dashboard is open)."""
        return "" if self.token is None else self._derive("csrf")

    def token_matches(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def allows(self, request: Request) -> bool:
        """May this request see the pages?"""
        if self.token is None:
            return True
        header = request.headers.get("authorization", "")
        if header.lower().startswith("bearer ") and self.token_matches(header[7:].strip()):
            return True
        cookie = request.cookies.get(COOKIE, "")
        return hmac.compare_digest(cookie.encode(), self.session().encode())

    def host_allowed(self, request: Request) -> bool:
        """May this request's `Host` reach the pages? Always with a token (a rebound page has
        neither the token nor the cookie); for an open dashboard, loopback and `hosts` only.

        >>> from starlette.requests import Request
        >>> def asking(host: str) -> Request:
        ...     return Request({"type": "http", "headers": [(b"host", host.encode())]})
        >>> rules = Access(hosts=frozenset({"box.internal"}))
        >>> [rules.host_allowed(asking(h)) for h in ("127.0.0.1:8080", "[::1]:80", "box.internal")]
        [True, True, True]
        >>> rules.host_allowed(asking("evil.example:8080"))
        False
        """
        if self.token is not None:
            return True
        host = request.headers.get("host", "")
        name = host[1:].split("]", 1)[0] if host.startswith("[") else host.rsplit(":", 1)[0]
        return name.lower() in LOOPBACK_NAMES | self.hosts

    def csrf_matches(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given.encode(), self.csrf().encode())

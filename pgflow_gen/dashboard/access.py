"""Who may look and who may act. Without a token every page is open (the dashboard then listens
on loopback only: the CLI refuses anything else). With a token, every page but the login page
and the static files needs it: as `Authorization: Bearer <token>` (scrapers, scripts) or as the
session cookie the login page sets (browsers). The cookie is new at each sign-in and expires
after SESSION_S: its expiry and a random nonce, signed with an HMAC keyed by the token (never the
token itself); it is `Secure` when the page came over TLS or through a trusted proxy. Wrong tokens
are counted per client address (`Throttle`): after FAILURES_ALLOWED within WINDOW_S that address
waits out the window.
Actions need `allow_actions` and a token, and every form carries a CSRF value derived from the
token, so another site cannot post one with the operator's cookie.

An open dashboard answers only requests whose `Host` names loopback, the address it listens on,
or a name in `hosts` (`--allowed-host`): a page of another site that re-points its own name at
127.0.0.1 (DNS rebinding) reaches the port, but under its own name, and is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.requests import Request

COOKIE = "pgflow_dashboard"
#: How long a sign-in lasts.
SESSION_S = 12 * 3600
#: Wrong tokens an address may send within WINDOW_S before it must wait.
FAILURES_ALLOWED = 5
WINDOW_S = 60.0
#: The most addresses the throttle remembers (the oldest are forgotten first).
THROTTLE_ADDRESSES = 10_000
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
    #: Served behind a trusted proxy (--forwarded-allow-ips): the session cookie is `Secure`.
    behind_proxy: bool = False

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

    def session(self, now: float | None = None) -> str:
        """A new session cookie value: its expiry, a random nonce, and their HMAC.

        >>> rules = Access(token="a-long-token")
        >>> first, second = rules.session(), rules.session()
        >>> first != second and rules.session_valid(first) and rules.session_valid(second)
        True
        >>> rules.session_valid(rules.session(now=time.time() - SESSION_S - 1))
        False
        >>> rules.session_valid(first[:-1] + ("0" if first[-1] != "0" else "1"))
        False
        """
        expires = int((time.time() if now is None else now) + SESSION_S)
        nonce = secrets.token_urlsafe(12)
        return f"{expires}.{nonce}.{self._derive(f'session:{expires}:{nonce}')}"

    def session_valid(self, value: str) -> bool:
        if self.token is None:
            return False
        try:
            expires, nonce, mac = value.split(".", 2)
            expired = int(expires) < time.time()
        except ValueError:
            return False
        expected = self._derive(f"session:{expires}:{nonce}")
        return hmac.compare_digest(mac.encode(), expected.encode()) and not expired

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
        return self.session_valid(request.cookies.get(COOKIE, ""))

    def secure_cookie(self, request: Request) -> bool:
        """Whether the session cookie is `Secure`: over TLS, or behind a trusted proxy."""
        return request.url.scheme == "https" or self.behind_proxy

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


class Throttle:
    """Wrong tokens per client address: after FAILURES_ALLOWED within WINDOW_S, the address
    waits until the oldest of them leaves the window (brute force gets 5 guesses a minute).

    >>> clock = [0.0]
    >>> throttle = Throttle(clock=lambda: clock[0])
    >>> for _ in range(FAILURES_ALLOWED):
    ...     throttle.failed("10.0.0.7")
    >>> throttle.wait_s("10.0.0.7"), throttle.wait_s("10.0.0.8")
    (60.0, 0.0)
    >>> clock[0] = 61.0
    >>> throttle.wait_s("10.0.0.7")
    0.0
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._failures: dict[str, list[float]] = {}

    def wait_s(self, address: str) -> float:
        """Seconds until `address` may try a token again (0: now)."""
        now = self._clock()
        recent = [at for at in self._failures.get(address, ()) if at > now - WINDOW_S]
        if recent:
            self._failures[address] = recent
        else:
            self._failures.pop(address, None)
        if len(recent) < FAILURES_ALLOWED:
            return 0.0
        return recent[-FAILURES_ALLOWED] + WINDOW_S - now

    def failed(self, address: str) -> None:
        self._failures.setdefault(address, []).append(self._clock())
        while len(self._failures) > THROTTLE_ADDRESSES:
            del self._failures[next(iter(self._failures))]

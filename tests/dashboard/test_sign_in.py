"""Signing in holds under abuse (engine integrity, section 8): each sign-in gets a cookie of its
own that expires, `Secure` behind a trusted proxy or TLS; wrong tokens from one address are
slowed down (5 a minute, then 429 with Retry-After), whatever way they come."""

from __future__ import annotations

from collections.abc import Callable

from tests.dashboard.conftest import TOKEN, Dashboard


def cookie_of(reply_headers: dict[str, str]) -> str:
    return reply_headers["set-cookie"].split(";")[0]


def test_each_sign_in_gets_its_own_cookie_and_a_changed_one_is_refused(
    start: Callable[..., Dashboard],
) -> None:
    dashboard = start(PGFLOW_DASHBOARD_TOKEN=TOKEN)
    first = dashboard.post("/login?next=/", {"token": TOKEN})
    second = dashboard.post("/login?next=/", {"token": TOKEN})
    cookies = [cookie_of(first.headers), cookie_of(second.headers)]
    assert cookies[0] != cookies[1]
    assert "Max-Age=43200" in first.headers["set-cookie"]
    assert "Secure" not in first.headers["set-cookie"]  # plain http, no proxy named
    for cookie in cookies:
        assert dashboard.get("/", cookie=cookie).status == 200
    expires, nonce, mac = cookies[0].split("=", 1)[1].split(".")
    for forged in (f"1.{nonce}.{mac}", f"{int(expires) + 1}.{nonce}.{mac}", "forged"):
        assert dashboard.get("/", cookie=f"pgflow_dashboard={forged}").status == 303


def test_behind_a_trusted_proxy_the_cookie_is_secure(start: Callable[..., Dashboard]) -> None:
    dashboard = start("--forwarded-allow-ips", "127.0.0.1", PGFLOW_DASHBOARD_TOKEN=TOKEN)
    reply = dashboard.post(
        "/login?next=/", {"token": TOKEN}, headers={"x-forwarded-proto": "https"}
    )
    assert reply.status == 303
    assert "Secure" in reply.headers["set-cookie"]


def test_wrong_tokens_from_one_address_are_slowed_down(start: Callable[..., Dashboard]) -> None:
    dashboard = start(PGFLOW_DASHBOARD_TOKEN=TOKEN)
    for guess in range(5):
        assert dashboard.post("/login", {"token": f"guess {guess}"}).status == 401
    throttled = dashboard.post("/login", {"token": "guess 5"})
    assert throttled.status == 429
    assert 0 < int(throttled.headers["retry-after"]) <= 60
    assert "Too many wrong tokens from this address" in throttled.body
    # Nor does the right token, a bearer or a link with the token get through meanwhile.
    assert dashboard.post("/login", {"token": TOKEN}).status == 429
    assert dashboard.get("/metrics", html=False, token=TOKEN).status == 429
    assert dashboard.get(f"/runs?token={TOKEN}").status == 429
    assert dashboard.log().count("a wrong dashboard token from 127.0.0.1") == 5


def test_wrong_bearer_tokens_count_too(start: Callable[..., Dashboard]) -> None:
    dashboard = start(PGFLOW_DASHBOARD_TOKEN=TOKEN)
    for guess in range(5):
        assert dashboard.get("/metrics", html=False, token=f"guess {guess}").status == 401
    assert dashboard.get("/metrics", html=False, token="guess 5").status == 429

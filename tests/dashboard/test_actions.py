"""Access and actions over HTTP: the token guards every page; actions need --allow-actions, the
token and the form's CSRF value; each goes through the engine, is recorded with the operator's
address and answered with the page it came from saying what happened (or why not)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from urllib.parse import unquote_plus

import pytest

from tests.dashboard.conftest import (
    SHOWCASE,
    TOKEN,
    Dashboard,
    define_showcase,
    finished_showcase,
)
from tests.e2e.harness import Db


@pytest.fixture
def operator(start: Callable[..., Dashboard]) -> Dashboard:
    return start("--allow-actions", PGFLOW_DASHBOARD_TOKEN=TOKEN)


def sign_in(dashboard: Dashboard) -> str:
    """The session cookie the login form sets."""
    reply = dashboard.post("/login?next=/", {"token": TOKEN})
    assert reply.status == 303
    cookie = reply.headers["set-cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie
    return cookie.split(";")[0]


def csrf(dashboard: Dashboard, path: str, cookie: str) -> str:
    """The CSRF value of the action forms on a page."""
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', dashboard.get(path, cookie=cookie).body)
    assert found is not None, "no action form on " + path
    return found[1]


def outcome(location: str) -> str:
    return unquote_plus(location.split("?", 1)[1].split("=", 1)[1])


def test_the_token_guards_every_page_but_the_login(operator: Dashboard) -> None:
    assert operator.get("/").status == 303  # a browser goes to the login page
    assert operator.get("/").headers["location"] == "/login?next=/"
    assert operator.get("/metrics", html=False).status == 401
    assert operator.get("/metrics", html=False, token="wrong token").status == 401
    assert operator.get("/metrics", html=False, token=TOKEN).status == 200
    assert operator.get("/login").status == 200
    assert operator.get("/static/style.css").status == 200
    wrong = operator.post("/login", {"token": "wrong token"})
    assert wrong.status == 401
    assert "That is not the token." in wrong.body

    link = operator.get(f"/runs?flow=x&token={TOKEN}")  # a link with the token signs in once
    assert (link.status, link.headers["location"]) == (303, "/runs?flow=x")
    assert link.headers["set-cookie"].startswith("pgflow_dashboard=")

    cookie = sign_in(operator)
    assert TOKEN not in cookie
    assert operator.get("/", cookie=cookie).status == 200
    assert operator.get("/", cookie="pgflow_dashboard=forged").status == 303


def test_an_action_without_its_csrf_value_changes_nothing(operator: Dashboard, db: Db) -> None:
    define_showcase(db)
    run_id = db.start(SHOWCASE, {"url": "x"})
    cookie = sign_in(operator)
    for form in ({}, {"csrf": "0" * 64}):
        refused = operator.post(f"/runs/{run_id}/cancel", form, cookie=cookie)
        assert refused.status == 403
        assert "CSRF" in refused.body
    assert db.run(run_id)["status"] == "started"
    assert db.value("select count(*) from pgflow.operator_actions") == 0


def test_retry_a_failed_run_and_it_is_recorded(operator: Dashboard, db: Db) -> None:
    define_showcase(db)
    run_id = finished_showcase(db)
    cookie = sign_in(operator)
    token = csrf(operator, f"/runs/{run_id}", cookie)

    # A forwarded address from loopback is not trusted without --forwarded-allow-ips.
    reply = operator.post(
        f"/runs/{run_id}/retry",
        {"csrf": token},
        cookie=cookie,
        headers={"x-forwarded-for": "203.0.113.9"},
    )

    assert reply.status == 303
    assert reply.headers["location"].startswith(f"/runs/{run_id}?done=")
    assert outcome(reply.headers["location"]) == f"Retried run {run_id} from where it failed."
    assert db.run(run_id)["status"] == "started"
    # The engine recorded it (engine 0020): the dashboard's login role acted, its label beside.
    [action] = db.all(
        "select action, actor, label, run_id, flow_slug, acted_at <= now() as now"
        " from pgflow.operator_actions"
    )
    assert action == {
        "action": "retry", "actor": db.value("select current_user"),
        "label": "dashboard (127.0.0.1)", "run_id": run_id, "flow_slug": SHOWCASE, "now": True,
    }  # fmt: skip


def test_a_refused_action_says_why_and_records_nothing(operator: Dashboard, db: Db) -> None:
    define_showcase(db)
    failed = finished_showcase(db)
    running = db.start(SHOWCASE, {"url": "x"})
    cookie = sign_in(operator)
    token = csrf(operator, f"/runs/{running}", cookie)

    reply = operator.post(f"/runs/{failed}/cancel", {"csrf": token}, cookie=cookie)
    assert reply.headers["location"].startswith(f"/runs/{failed}?error=")
    assert outcome(reply.headers["location"]) == (
        f"Run {failed} is failed already; only a started run can be cancelled."
    )
    reply = operator.post(f"/runs/{running}/retry", {"csrf": token}, cookie=cookie)
    assert outcome(reply.headers["location"]) == (
        f"Run {running} is started; only a failed run can be retried."
    )
    missing = uuid.uuid4()
    assert operator.post(f"/runs/{missing}/cancel", {"csrf": token}, cookie=cookie).status == 404
    assert db.value("select count(*) from pgflow.operator_actions") == 0
    assert db.run(failed)["status"] == "failed"
    assert "refused" in operator.log()


def test_pause_and_resume_a_step_from_the_queues_page(operator: Dashboard, db: Db) -> None:
    db.compile("stepped", [{"slug": "first"}, {"slug": "second", "dependencies": ["first"]}])
    cookie = sign_in(operator)
    token = csrf(operator, "/queues", cookie)

    paused = operator.post(
        "/flows/stepped/steps/second/pause?back=/queues",
        {"csrf": token, "reason": "API down"},
        cookie=cookie,
    )
    assert paused.headers["location"].startswith("/queues?done=Paused+step+second")
    assert db.all("select step_slug, reason from pgflow.step_pauses") == [
        {"step_slug": "second", "reason": "API down"}
    ]
    resumed = operator.post("/flows/stepped/steps/second/resume", {"csrf": token}, cookie=cookie)
    assert outcome(resumed.headers["location"]) == (
        "Resumed step second of stepped: 0 held tasks can start."
    )
    assert db.value("select count(*) from pgflow.step_pauses") == 0
    actions = db.all(
        "select action, flow_slug, step_slug, detail from pgflow.operator_actions"
        " order by action_id"
    )
    assert actions == [
        {"action": "pause", "flow_slug": "stepped", "step_slug": "second",
         "detail": {"reason": "API down"}},
        {"action": "resume", "flow_slug": "stepped", "step_slug": "second", "detail": None},
    ]  # fmt: skip
    elsewhere = operator.post(
        "/flows/stepped/steps/second/pause?back=https://evil.example",
        {"csrf": token},
        cookie=cookie,
    )
    assert elsewhere.headers["location"].startswith("/queues?")  # never a redirect away


def test_send_a_signal_with_a_payload(operator: Dashboard, db: Db) -> None:
    db.flow("approve", {"slug": "ask"}, {"slug": "answer", "deps_slugs": ["ask"],
                                         "step_type": "signal"})  # fmt: skip
    run_id = db.start("approve")
    [task] = db.poll("approve")
    db.complete(task, "please")
    cookie = sign_in(operator)
    page = csrf(operator, f"/runs/{run_id}", cookie)

    bad = operator.post(
        f"/runs/{run_id}/signal",
        {"csrf": page, "step_slug": "answer", "payload": "{yes"},
        cookie=cookie,
    )
    assert outcome(bad.headers["location"]).startswith("The payload is not JSON")
    sent = operator.post(
        f"/runs/{run_id}/signal",
        {"csrf": page, "step_slug": "answer", "payload": '{"ok": true}'},
        cookie=cookie,
    )
    assert outcome(sent.headers["location"]) == "Sent the signal of step answer."
    assert db.run(run_id)["status"] == "completed"
    [action] = db.all("select action, step_slug, detail from pgflow.operator_actions")
    assert action == {
        "action": "signal",
        "step_slug": "answer",
        "detail": {"payload": {"ok": True}},
    }


def test_a_failed_run_offers_no_signal(operator: Dashboard, db: Db) -> None:
    # Its signal step was waiting when another step failed the run: nothing waits any more.
    db.flow("gated", {"slug": "answer", "step_type": "signal"}, {"slug": "charge"},
            max_attempts=1)  # fmt: skip
    run_id = db.start("gated")
    [task] = db.poll("gated")
    db.fail(task, "RuntimeError: card declined")
    assert db.run(run_id)["status"] == "failed"
    page = operator.get(f"/runs/{run_id}", cookie=sign_in(operator))
    assert "waiting for a signal" not in page.body
    assert f'action="/runs/{run_id}/signal"' not in page.body


def test_fork_a_run_from_a_step_and_the_new_run_says_where_it_came_from(
    operator: Dashboard, db: Db
) -> None:
    define_showcase(db)
    run_id = finished_showcase(db)
    cookie = sign_in(operator)
    page = operator.get(f"/runs/{run_id}", cookie=cookie).body
    assert '<option value="parse">parse</option>' in page  # the step to fork from, chosen
    token = csrf(operator, f"/runs/{run_id}", cookie)

    reply = operator.post(
        f"/runs/{run_id}/fork", {"csrf": token, "from_step": "parse"}, cookie=cookie
    )

    assert reply.status == 303
    [new] = db.all("select * from pgflow.runs where forked_from_run_id = %s", run_id)
    assert reply.headers["location"].startswith(f"/runs/{new['run_id']}?done=")
    assert outcome(reply.headers["location"]) == (
        f"Forked run {run_id} from step parse: this is the new run."
    )
    assert (new["status"], new["forked_from_step"]) == ("started", "parse")
    shown = operator.get(f"/runs/{new['run_id']}", cookie=cookie).body
    assert f'<a href="/runs/{run_id}"><code>{run_id}</code></a>' in shown
    assert "(from its step parse)" in shown
    [action] = db.all("select action, label, run_id, step_slug from pgflow.operator_actions")
    assert action == {
        "action": "fork", "label": "dashboard (127.0.0.1)", "run_id": new["run_id"],
        "step_slug": "parse",
    }  # fmt: skip
    # A fork the engine refuses says why: notify would copy parse, which failed.
    reply = operator.post(
        f"/runs/{run_id}/fork", {"csrf": token, "from_step": "notify"}, cookie=cookie
    )
    assert outcome(reply.headers["location"]) == (
        f'Run {run_id} cannot be forked from step "notify": step "parse", which it would copy,'
        " is failed."
    )

"""The dashboard in a real browser: Debian's Chromium driven by Playwright (through
`executable_path`; nothing downloads a browser). It walks overview -> runs -> run -> queues ->
workers, checks the DAG's colours of a run with a completed, a failed and a skipped step, follows
a running run live, and acts (with a token) where actions are allowed.

Screenshots go to $PGFLOW_SCREENSHOTS when set (docs/images was made so), else to the test's
temporary folder."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dashboard.conftest import (
    SHOWCASE,
    TOKEN,
    Dashboard,
    define_showcase,
    finished_showcase,
)
from tests.e2e.harness import DEADLINE_S, Db

CHROMIUM = Path(os.environ.get("PGFLOW_TEST_CHROMIUM", "/usr/bin/chromium"))
if not CHROMIUM.exists():
    pytest.skip(
        f"no Chromium at {CHROMIUM}: install Debian's (apt-get install chromium; .ci/run does),"
        " or point PGFLOW_TEST_CHROMIUM at one",
        allow_module_level=True,
    )

from playwright.sync_api import Browser, Page, expect, sync_playwright  # noqa: E402

# Flags for a headless Chromium on a machine without a network or a sandbox (root in CI).
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = DEADLINE_S * 1000


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    opened = context.new_page()
    opened.set_default_timeout(WAIT_MS)
    yield opened
    context.close()


@pytest.fixture
def shots(tmp_path: Path) -> Callable[[Page, str], None]:
    folder = Path(os.environ.get("PGFLOW_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)

    def shoot(page: Page, name: str) -> None:
        page.screenshot(path=str(folder / f"dashboard-{name}.png"), full_page=True)
        assert (folder / f"dashboard-{name}.png").stat().st_size > 0

    return shoot


def test_walk_through_every_page_read_only(
    dashboard: Dashboard, db: Db, page: Page, shots: Callable[[Page, str], None]
) -> None:
    define_showcase(db)
    run_id = finished_showcase(db)
    db.start(SHOWCASE, {"url": "https://example.org"})
    order_id = waiting_order(db)
    db.compile("stepped", [{"slug": "first"}, {"slug": "second", "dependencies": ["first"]}])
    db.start("stepped")
    db.register("stepped__first")

    page.goto(dashboard.url + "/")
    expect(page.locator("h1")).to_have_text("Overview")
    expect(page.locator(f'tr[data-flow="{SHOWCASE}"] a[data-status="failed"]')).to_contain_text("1")
    expect(page.locator(".attention")).to_contain_text("no live worker")  # stepped's second step
    shots(page, "overview")

    page.get_by_role("link", name="Runs", exact=True).click()
    expect(page.locator("h1")).to_have_text("Runs")
    expect(page.locator("tr[data-run]")).to_have_count(4)
    expect(page.locator(f'tr[data-run="{order_id}"] .waiting')).to_have_text(
        "waiting for a signal: approval"
    )
    expect(page.locator(f'tr[data-run="{run_id}"] td.why')).to_have_text(
        "parse: ValueError: no table in the page"
    )
    shots(page, "runs")

    page.locator(f'tr[data-run="{order_id}"] a').click()
    expect(page.locator('svg.dag g[data-step="approval"]')).to_have_attribute(
        "data-state", "waiting"
    )
    expect(page.locator('svg.dag g[data-step="priceLines"] .caption')).to_have_text(
        "completed, 3/3 tasks"
    )
    expect(page.locator('svg.dag g[data-step="notifyCustomer"] .condition')).to_have_text(
        'if: {"approval":{"appro…'
    )
    shots(page, "run-graph")
    page.go_back()

    page.locator(f'tr[data-run="{run_id}"] a').click()
    expect(page.locator("h1")).to_contain_text(str(run_id))
    for step, state in (("fetch", "completed"), ("notify", "skipped"), ("parse", "failed")):
        node = page.locator(f'svg.dag g[data-step="{step}"]')
        expect(node).to_have_attribute("data-state", state)
        expect(node).to_have_class(f"node state-{state} kind-task")
    colour = page.locator('svg.dag g[data-step="parse"] rect').evaluate(
        "element => getComputedStyle(element).stroke"
    )
    assert colour == "rgb(199, 50, 43)"  # the stylesheet's red, so the style applied
    expect(page.locator("#step-parse .error pre")).to_contain_text("no table in the page")
    expect(page.locator(".failure")).to_contain_text("Failed at parse: ValueError: no table")
    expect(page.locator(".failure code")).to_have_text(f"pgflow-gen retry {str(run_id)[:8]}")
    expect(page.locator(".timeline li").last).to_contain_text("run failed")
    shots(page, "run")

    page.get_by_role("link", name="Queues", exact=True).click()
    expect(page.locator('tr[data-queue="stepped__first"] td.coverage')).to_have_text("1")
    expect(page.locator('tr[data-queue="stepped__second"]')).to_contain_text("no live worker")
    shots(page, "queues")

    page.get_by_role("link", name="Workers", exact=True).click()
    expect(page.locator("tr[data-worker]").first).to_contain_text("stepped__first")
    shots(page, "workers")

    # Read-only: no action on any page, and the header says so.
    for path in ("/", "/runs", f"/runs/{run_id}", "/queues", "/workers"):
        page.goto(dashboard.url + path)
        expect(page.locator("form.action")).to_have_count(0)
        expect(page.locator(".mode")).to_have_text("read-only")


def waiting_order(db: Db) -> Any:
    """The issue's order flow, half way: priced and stocked, waiting for its approval; charge
    waits for validateOrder two columns back, and notifyCustomer has a condition."""
    db.flow(
        "orders",
        {"slug": "validateOrder"},
        {"slug": "reserveStock", "deps_slugs": ["validateOrder"]},
        {"slug": "priceLines", "deps_slugs": ["validateOrder"], "step_type": "map"},
        {"slug": "approval", "deps_slugs": ["reserveStock"], "step_type": "signal"},
        {"slug": "charge", "deps_slugs": ["validateOrder", "priceLines", "approval"]},
        {"slug": "notifyCustomer", "deps_slugs": ["charge", "approval"],
         "required_input_pattern": {"approval": {"approved": True}}},
    )  # fmt: skip
    order_id = db.start("orders", {"order": 1042, "lines": ["tea", "cups", "pot"]})
    [validate] = db.poll("orders")
    db.complete(validate, ["tea", "cups", "pot"])
    for task in db.poll("orders"):
        db.complete(task, {"ok": True})
    return order_id


def test_a_running_run_updates_live(dashboard: Dashboard, db: Db, page: Page) -> None:
    define_showcase(db)
    run_id = db.start(SHOWCASE, {"url": "https://example.org"})
    page.goto(f"{dashboard.url}/runs/{run_id}")
    fetch = page.locator('svg.dag g[data-step="fetch"]')
    expect(fetch).to_have_attribute("data-state", "started")
    expect(page.locator(".live-badge")).to_be_visible()
    gap = page.evaluate(
        "() => document.querySelector('.live-badge').getBoundingClientRect().left"
        " - document.querySelector('.run-status .status').getBoundingClientRect().right"
    )
    assert gap >= 4  # a space between the status and the badge
    page.wait_for_function("document.getElementById('live').dataset.refreshes >= '1'")

    [task] = db.poll(SHOWCASE)
    db.complete(task, {"send": True})

    # No reload: the page hears the run's events and redraws itself.
    expect(fetch).to_have_attribute("data-state", "completed")
    expect(page.locator('svg.dag g[data-step="notify"]')).to_have_attribute("data-state", "started")

    for task in db.poll(SHOWCASE):
        db.complete(task, "done")
    expect(page.locator(".run-status")).to_have_attribute("data-status", "completed")
    expect(page.locator(".live-badge")).to_have_count(0)


def test_with_a_token_an_operator_signs_in_and_cancels_a_run(
    start: Callable[..., Dashboard], db: Db, page: Page, shots: Callable[[Page, str], None]
) -> None:
    dashboard = start("--allow-actions", PGFLOW_DASHBOARD_TOKEN=TOKEN)
    define_showcase(db)
    run_id = db.start(SHOWCASE, {"url": "https://example.org"})

    page.goto(f"{dashboard.url}/runs/{run_id}")
    expect(page.locator("h1")).to_have_text("Sign in")  # the token comes first
    page.get_by_label("token").fill("not it")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator(".flash.problem")).to_have_text("That is not the token.")
    page.get_by_label("token").fill(TOKEN)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("h1")).to_contain_text(str(run_id))
    expect(page.locator(".mode")).to_have_text("actions allowed")

    questions: list[str] = []

    def answer(dialog: Any) -> None:
        questions.append(dialog.message)
        dialog.accept()

    page.on("dialog", answer)
    page.get_by_label("reason (optional)").fill("duplicate order")
    page.get_by_role("button", name="Cancel run").click()
    expect(page.locator(".flash.notice")).to_have_text(f"Cancelled run {run_id}.")
    assert questions == ["Cancel this run? Queued tasks never run."]
    expect(page.locator(".run-status")).to_have_attribute("data-status", "cancelled")
    expect(page.locator(".timeline")).to_contain_text("cancel (operator)")
    expect(page.locator(".timeline")).to_contain_text("duplicate order")
    shots(page, "cancelled")

    [action] = db.all("select action, actor, label, detail from pgflow.operator_actions")
    assert action["action"] == "cancel"
    assert (action["actor"], action["label"]) == (
        db.value("select current_user"),
        "dashboard (127.0.0.1)",
    )
    assert action["detail"] == {"reason": "duplicate order"}
    assert "Cancelled run" in dashboard.log()  # and the dashboard logged it


def test_the_live_page_does_not_redraw_a_form_the_operator_is_at(
    start: Callable[..., Dashboard], db: Db, page: Page
) -> None:
    """A redraw between the press of a button and its release would swallow the click: while
    the focus is in one of the run's forms (its button included), a refresh waits."""
    dashboard = start("--allow-actions", PGFLOW_DASHBOARD_TOKEN=TOKEN)
    define_showcase(db)
    run_id = db.start(SHOWCASE, {"url": "https://example.org"})
    page.goto(f"{dashboard.url}/runs/{run_id}")
    page.get_by_label("token").fill(TOKEN)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("h1")).to_contain_text(str(run_id))
    page.wait_for_function("document.getElementById('live').dataset.refreshes >= '1'")
    fetch = page.locator('svg.dag g[data-step="fetch"]')
    expect(fetch).to_have_attribute("data-state", "started")

    page.get_by_role("button", name="Cancel run").focus()
    [task] = db.poll(SHOWCASE)
    db.complete(task, {"send": True})
    page.wait_for_function("document.getElementById('live').dataset.held === 'yes'")
    expect(fetch).to_have_attribute("data-state", "started")  # held, not redrawn

    page.get_by_role("button", name="Cancel run").blur()
    expect(fetch).to_have_attribute("data-state", "completed")
    expect(page.locator("#live")).to_have_attribute("data-held", "no")

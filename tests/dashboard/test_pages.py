"""The dashboard's pages over HTTP, served by `pgflow-gen dashboard` against the real engine: what
each shows, keyset pages that neither skip nor repeat a run, and a clear page (never a
traceback) for every wrong address."""

from __future__ import annotations

import datetime
import html
import json
import re
import uuid

from pgflow_gen.dashboard.app import environment
from tests.dashboard.conftest import SHOWCASE, Dashboard, define_showcase, finished_showcase
from tests.e2e.harness import Db
from tests.engine import WORKER_ID


def test_the_overview_lists_flows_with_their_runs_and_what_needs_attention(
    dashboard: Dashboard, db: Db
) -> None:
    define_showcase(db)
    finished_showcase(db)
    running = db.start(SHOWCASE, {"url": "x"})
    db.call("pause_step", SHOWCASE, "parse", "the parser is being fixed")
    # The test's own claims registered a worker: it has gone quiet since.
    db.conn.execute("update pgflow.workers set last_heartbeat_at = now() - interval '1 hour'")

    page = dashboard.get("/")

    assert page.status == 200
    row = _row(page.body, f'data-flow="{SHOWCASE}"')
    assert re.search(r'data-status="failed".*?failed</span> 1<', row, re.S)
    assert re.search(r'data-status="started".*?started</span> 1<', row, re.S)
    # fetch and parse, in one minute or two
    assert re.search(r'aria-label="tasks per minute, last hour: 2 in all, at most [12] in a', row)
    attention = page.body.split('id="attention-heading"')[1].split("</section>")[0]
    assert "no live worker" in attention  # nothing serves the showcase queue
    assert "paused" in attention
    assert "the parser is being fixed" in attention
    assert running


def test_a_run_page_shows_each_step_its_state_error_output_and_timeline(
    dashboard: Dashboard, db: Db
) -> None:
    define_showcase(db)
    run_id = finished_showcase(db)

    page = dashboard.get(f"/runs/{run_id}")

    assert page.status == 200
    states = dict(re.findall(r'<g class="node state-\w+ kind-task" data-step="(\w+)"'
                             r' data-state="(\w+)"', page.body))  # fmt: skip
    assert states == {"fetch": "completed", "notify": "skipped", "parse": "failed"}
    assert 'data-from="fetch" data-to="parse"' in page.body
    parse = _section(page.body, "parse")
    assert "ValueError: no table in the page" in parse
    assert "Traceback (most recent call last)" in parse
    assert "1 of 1" in parse  # attempts
    fetch = _section(page.body, "fetch")
    assert "&#34;send&#34;: false" in fetch or "&quot;send&quot;: false" in fetch
    assert "condition_unmet" in _section(page.body, "notify")
    timeline = page.body.split('class="timeline"')[1]
    order = [m for m in re.findall(r'<span class="what">([^<]+)</span>', timeline)]
    assert order[0] == "run started"
    assert order[-1] == "run failed"
    assert "step skipped" in order
    assert "step failed" in order


def test_a_failed_run_says_at_the_top_which_step_failed_why_and_how_to_retry(
    dashboard: Dashboard, db: Db
) -> None:
    define_showcase(db)
    run_id = finished_showcase(db)

    page = dashboard.get(f"/runs/{run_id}")

    summary = page.body.split('<div class="failure" role="alert">')[1].split("</div>")[0]
    words = " ".join(re.sub(r"<[^>]+>", " ", summary).split())
    assert words == (
        "Failed at parse : ValueError: no table in the page"
        f" To retry it from where it failed: pgflow-gen retry {str(run_id)[:8]}"
    )
    assert page.body.index('class="failure"') < page.body.index('class="run-facts"')
    running = dashboard.get(f"/runs/{db.start(SHOWCASE, {'url': 'x'})}")
    assert 'class="failure"' not in running.body


def test_a_run_page_shows_the_input_cut_with_a_link_to_all_of_it(
    dashboard: Dashboard, db: Db
) -> None:
    db.flow("big", {"slug": "make"})
    small = db.start("big", {"name": "Ada"})
    large = db.start("big", {"rows": [f"row {i}" for i in range(1000)]})

    page = dashboard.get(f"/runs/{small}")
    assert re.search(r'<dd class="input"><pre>{(&#34;|&quot;)name', page.body)
    assert f'<a href="/runs/{small}/input">as JSON</a>' in page.body
    page = dashboard.get(f"/runs/{large}")
    length = len(db.value("select input::text from pgflow.runs where run_id = %s", large))
    assert f"the whole input ({length:,} characters, JSON)" in page.body
    head = page.body.split('<dd class="input"><pre>')[1].split("</pre>")[0]
    assert head.endswith("…")
    whole = dashboard.get(f"/runs/{large}/input", html=False)
    assert whole.status == 200
    assert json.loads(whole.body)["rows"][999] == "row 999"
    missing = dashboard.get(f"/runs/{uuid.UUID(int=7)}/input", html=False)
    assert missing.status == 404


def test_the_graph_shows_conditions_and_map_counts(dashboard: Dashboard, db: Db) -> None:
    db.flow(
        "mapped",
        {"slug": "list"},
        {"slug": "each", "deps_slugs": ["list"], "step_type": "map"},
        {"slug": "report", "deps_slugs": ["each"], "when_unmet": "fail",
         "required_input_pattern": {"each": [1]}},
    )  # fmt: skip
    run_id = db.start("mapped")
    before = dashboard.get(f"/runs/{run_id}")
    assert _node(before.body, "each")["caption"] == "created, map"
    [task] = db.poll("mapped")
    db.complete(task, [1, 2, 3])
    for task in db.poll("mapped", qty=2):
        db.complete(task, 1)

    page = dashboard.get(f"/runs/{run_id}")

    assert _node(page.body, "each")["caption"] == "started, 2/3 tasks"
    report = _node(page.body, "report")
    assert report["condition"] == "if: {&#34;each&#34;:[1]}, when_…"  # cut to fit the box
    assert (report["title"] or "").endswith("if: {&#34;each&#34;:[1]}, when_unmet: fail")
    assert _node(page.body, "list")["condition"] is None


def test_a_long_output_is_cut_with_a_link_to_all_of_it(dashboard: Dashboard, db: Db) -> None:
    db.flow("big", {"slug": "make"})
    run_id = db.start("big")
    [task] = db.poll("big")
    db.complete(task, {"rows": [f"row {i}" for i in range(1000)]})

    page = dashboard.get(f"/runs/{run_id}")
    assert "the first 2,000 of" in page.body
    link = f"/runs/{run_id}/steps/make/output"
    assert link in page.body
    whole = dashboard.get(link, html=False)
    assert whole.status == 200
    assert json.loads(whole.body)["rows"][999] == "row 999"


def test_runs_are_paged_by_keyset_without_skipping_or_repeating_a_run(
    dashboard: Dashboard, db: Db
) -> None:
    db.flow("many", {"slug": "only"})
    started = {db.start("many") for _ in range(120)}
    # Several runs share a start time: the run id breaks the tie.
    db.conn.execute("update pgflow.runs set started_at = date_trunc('second', started_at)")

    seen: list[str] = []
    pages = []
    path = "/runs?flow=many"
    while path:
        page = dashboard.get(path)
        assert page.status == 200
        pages.append(page.body)
        seen += re.findall(r'<tr data-run="([0-9a-f-]{36})">', page.body)
        older = re.search(r'<a rel="next" href="([^"]+)"', page.body)
        path = older[1].replace("&amp;", "&") if older else ""
    assert [len(re.findall(r"<tr data-run=", body)) for body in pages] == [50, 50, 20]
    assert sorted(seen) == sorted(str(run_id) for run_id in started)
    rows = db.conn.execute(
        "select run_id::text from pgflow.runs order by started_at desc, run_id desc"
    ).fetchall()
    assert seen == [row[0] for row in rows]

    # Back from the last page: the newer link gives the middle page again.
    newer = re.search(r'<a rel="prev" href="([^"]+)"', pages[2])
    assert newer is not None
    back = dashboard.get(newer[1].replace("&amp;", "&"))
    assert re.findall(r'<tr data-run="([0-9a-f-]{36})">', back.body) == seen[50:100]


def test_the_runs_list_says_which_signal_a_run_waits_for_and_why_a_run_failed(
    dashboard: Dashboard, db: Db
) -> None:
    define_showcase(db)
    failed = finished_showcase(db)
    db.flow("gated", {"slug": "approval", "step_type": "signal"}, {"slug": "charge"})
    waiting = db.start("gated")

    page = dashboard.get("/runs")

    row = _row(page.body, f'data-run="{waiting}"')
    assert '<span class="waiting">waiting for a signal: approval</span>' in row
    row = _row(page.body, f'data-run="{failed}"')
    assert 'title="ValueError: no table in the page"' in row
    assert "<code>parse</code>: ValueError: no table in the page</td>" in row
    assert "Traceback" not in row


def test_the_first_runs_page_shows_the_debounced_starts_waiting_for_their_runs(
    dashboard: Dashboard, db: Db
) -> None:
    define_showcase(db)
    db.flow("digest", {"slug": "send"})
    for _ in range(3):
        db.conn.execute("select pgflow.debounce_start('digest', '{}', 'user-7', 600, 3600)")

    page = dashboard.get("/runs")

    assert "<h2>Pending starts</h2>" in page.body
    row = _row(page.body, 'data-pending="user-7"')
    assert "<td>digest</td>" in row
    assert "<td>3</td>" in row
    other_flow = dashboard.get(f"/runs?flow={SHOWCASE}")
    assert "Pending starts" not in other_flow.body


def test_runs_filter_by_status_and_find_a_run_by_its_first_characters(
    dashboard: Dashboard, db: Db
) -> None:
    define_showcase(db)
    failed = finished_showcase(db)
    running = db.start(SHOWCASE, {"url": "x"})

    page = dashboard.get("/runs?status=failed")
    assert re.findall(r'<tr data-run="([0-9a-f-]{36})">', page.body) == [str(failed)]
    prefix = str(running)[:8]
    page = dashboard.get(f"/runs?q={prefix}")
    assert re.findall(r'<tr data-run="([0-9a-f-]{36})">', page.body) == [str(running)]
    whole = dashboard.get(f"/runs?q={running}")
    assert (whole.status, whole.headers["location"]) == (303, f"/runs/{running}")


def test_queues_and_workers_show_depth_coverage_and_state(dashboard: Dashboard, db: Db) -> None:
    db.compile("stepped", [{"slug": "first"}, {"slug": "second", "dependencies": ["first"]}])
    for _ in range(3):
        db.start("stepped")
    db.register("stepped__first")

    queues = dashboard.get("/queues")
    first = _row(queues.body, 'data-queue="stepped__first"')
    cells = re.findall(r"<td[^>]*>(.*?)</td>", first, re.S)
    assert cells[3:5] == ["3", "3"]  # messages, visible now
    assert 'data-covered="yes"' in first
    second = _row(queues.body, 'data-queue="stepped__second"')
    assert 'data-covered="no"' in second
    assert "no live worker" in second
    assert re.search(r'<td class="limits"><span class="muted">none</span></td>', first)

    db.call("set_step_limits", "stepped", "first", max_in_flight=1)
    db.conn.execute(
        "select * from pgflow.read_and_claim('stepped', 'stepped__first', %s, 10, 30, 'first')",
        (WORKER_ID,),
    )
    first = _row(dashboard.get("/queues").body, 'data-queue="stepped__first"')
    [limits] = re.findall(r'<td class="limits">(.*?)</td>', first, re.S)
    assert limits.startswith("1/1 in flight")
    assert "at limit" in limits

    workers = dashboard.get("/workers")
    assert 'data-state="live"' in workers.body
    assert "stepped__first" in workers.body


def test_the_queues_page_shows_an_operators_limits_over_the_specs(
    dashboard: Dashboard, db: Db
) -> None:
    db.compile("specced", [{"slug": "call", "options": {"maxInFlight": 3}}], options={})
    db.call("set_step_limits", "specced", "call", max_in_flight=5)
    override = db.one("select set_at, actor from pgflow.step_limit_overrides")
    at = override["set_at"].astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")

    row = _row(dashboard.get("/queues").body, 'data-queue="specced__call"')
    [limits] = re.findall(r'<td class="limits">(.*?)</td>', row, re.S)
    assert html.unescape(limits.strip()) == (
        f"0/5 in flight (an operator's, set by {override['actor']} on {at}; the spec says at"
        " most 3 in flight)"
    )


def test_a_wrong_address_gets_a_page_that_says_what_is_wrong(dashboard: Dashboard) -> None:
    missing = uuid.uuid4()
    cases = {
        f"/runs/{missing}": (404, f"No run {missing} in this database"),
        "/runs/not-a-run": (400, "Not a run id: &#39;not-a-run&#39;."),
        "/runs?older=bm9wZQ": (400, "not a page cursor"),
        "/runs?status=sleeping": (400, "Not a run status: &#39;sleeping&#39;."),
        "/runs?q=drop%20table": (400, "Search by run id or its first characters"),
        "/nowhere": (404, "Not Found"),
    }
    for path, (status, said) in cases.items():
        page = dashboard.get(path)
        assert (page.status, path) == (status, path)
        assert said in page.body, path
        assert "Traceback" not in page.body
    assert "Traceback" not in dashboard.log()


def test_a_read_only_dashboard_shows_no_action_and_refuses_one(
    dashboard: Dashboard, db: Db
) -> None:
    define_showcase(db)
    run_id = db.start(SHOWCASE, {"url": "x"})
    page = dashboard.get(f"/runs/{run_id}")
    assert "<form" not in page.body.split("<main>")[1]  # no action anywhere
    assert 'data-mode="read-only"' in page.body
    refused = dashboard.post(f"/runs/{run_id}/cancel", {"csrf": ""})
    assert refused.status == 403
    assert "read-only" in refused.body
    assert db.run(run_id)["status"] == "started"


def _row(body: str, marker: str) -> str:
    start = body.index(marker)
    return body[start : body.index("</tr>", start)]


def _node(body: str, step: str) -> dict[str, str | None]:
    """A step's box in the run page's graph: its tooltip, caption and condition line."""
    start = body.index(f'data-step="{step}" data-state=')
    box = body[start : body.index("</g>", start)]

    def text(pattern: str) -> str | None:
        found = re.search(pattern, box, re.S)
        return found[1] if found else None

    return {
        "title": text(r"<title>(.*?)</title>"),
        "caption": text(r'<text class="caption"[^>]*>(.*?)</text>'),
        "condition": text(r'<text class="condition"[^>]*>(.*?)</text>'),
    }


def _section(body: str, step: str) -> str:
    start = body.index(f'<section class="step" id="step-{step}"')
    return body[start : body.index("</section>", start)]


def test_a_backlog_grows_when_tasks_wait_long_and_more_wait_than_finished(
    dashboard: Dashboard, db: Db
) -> None:
    db.compile("stepped", [{"slug": "first"}, {"slug": "second", "dependencies": ["first"]}])
    db.register("stepped__first")  # covered, so only the backlog can need attention
    for _ in range(3):
        db.start("stepped")
    assert "backlog growing" not in dashboard.get("/queues").body  # they just came

    db.conn.execute(
        "update pgflow.step_tasks set queued_at = now() - interval '45 seconds'"
        " where step_slug = 'first'"
    )
    row = _row(dashboard.get("/queues").body, 'data-queue="stepped__first"')
    assert "backlog growing" in row  # 3 wait for 45 s, none finished in the last minute

    # Two finish, one waits on: the step keeps up (2 finished in the last minute, 1 waits).
    first, second = db.poll("stepped", queue="stepped__first", step="first", qty=2)
    db.complete(first, "done")
    db.complete(second, "done")
    row = _row(dashboard.get("/queues").body, 'data-queue="stepped__first"')
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
    assert cells[6:9] == ["1", "0", "2"]  # waiting, running, finished in the last minute
    assert "backlog growing" not in row


def test_workers_stopped_long_ago_do_not_pile_up_on_the_workers_page(
    dashboard: Dashboard, db: Db
) -> None:
    db.compile("stepped", [{"slug": "first"}])
    for worker in ("00000000-0000-0000-0000-0000000000c1", "00000000-0000-0000-0000-0000000000c2"):
        db.call("register_worker", uuid.UUID(worker), "stepped__first", "w", flow_slug="stepped")
        db.call("mark_worker_stopped", uuid.UUID(worker))
    db.conn.execute(
        "update pgflow.workers set stopped_at = now() - interval '2 hours'"
        " where worker_id = '00000000-0000-0000-0000-0000000000c1'"
    )
    shown = re.findall(r'<tr data-worker="([0-9a-f-]+)"', dashboard.get("/workers").body)
    assert shown == ["00000000-0000-0000-0000-0000000000c2"]  # stopped within the hour
    every = dashboard.get("/workers?all=1").body
    assert sorted(re.findall(r'<tr data-worker="([0-9a-f-]+)"', every)) == [
        "00000000-0000-0000-0000-0000000000c1",
        "00000000-0000-0000-0000-0000000000c2",
    ]
    assert 'href="/workers?all=1"' in dashboard.get("/workers").body

    # A later worker of the same name replaces c2 (as each restart of `dev` does): c2 goes.
    db.call("register_worker", uuid.UUID(int=0xC3), "stepped__first", "w", flow_slug="stepped")
    shown = re.findall(r'<tr data-worker="([0-9a-f-]+)"', dashboard.get("/workers").body)
    assert shown == [str(uuid.UUID(int=0xC3))]


def test_the_per_minute_chart_shows_a_quiet_minute_beside_a_burst() -> None:
    chart = environment().get_template("_macros.html").module.per_minute  # type: ignore[attr-defined]
    svg = str(chart([0] * 58 + [1, 1000]))
    heights = [float(h) for h in re.findall(r'<rect [^>]*height="([\d.]+)"', svg)]
    assert heights == [0] * 58 + [2, 30]  # the one task is still a bar; the burst is the top
    assert "1,000 a minute at most" in svg
    assert "60 min ago" in svg
    assert "no task this hour" in str(chart([0] * 60))


def test_a_run_page_links_a_subflow_steps_runs_and_each_of_them_its_parent(
    dashboard: Dashboard, db: Db
) -> None:
    db.flow("child", {"slug": "only"})
    db.flow("parent", {"slug": "each", "step_type": "map", "subflow_slug": "child"})
    run_id = db.start("parent", ["a", "b"])
    kids = db.all(
        "select run_id from pgflow.runs where parent_run_id = %s order by parent_task_index",
        run_id,
    )
    first = next(t for t in db.poll("child") if t.run_id == kids[0]["run_id"])
    db.complete(first, "A")

    page = dashboard.get(f"/runs/{run_id}")

    node = _node(page.body, "each")
    assert node["caption"] == "started, 1/2 runs, runs child"
    assert 'class="node state-started kind-subflow" data-step="each"' in page.body
    section = _section(page.body, "each")
    assert "none (a subflow step: its tasks are runs of" in section
    listed = re.findall(
        r'<li data-task="(\d)"><a href="/runs/([0-9a-f-]+)">.*?class="status status-(\w+)"', section
    )
    assert listed == [
        ("0", str(kids[0]["run_id"]), "completed"),
        ("1", str(kids[1]["run_id"]), "started"),
    ]
    child_page = dashboard.get(f"/runs/{kids[1]['run_id']}")
    assert f'<a href="/runs/{run_id}#step-each"><code>{run_id}</code></a>' in child_page.body
    assert "(its step each, task 1: this run is a subflow run)" in child_page.body

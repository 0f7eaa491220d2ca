"""start_tasks with the exact step selector: the claim table of the per-step-queue spec."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.engine import WORKER_ID, Engine

STEPS: list[dict[str, Any]] = [{"slug": "classify"}, {"slug": "deliverSlack", "deps": ["classify"]}]
CLASSIFY, DELIVER = "threads__classify", "threads__deliverslack"


@pytest.fixture
def threads(engine: Engine) -> Engine:
    engine.compile("threads", STEPS)
    engine.register(CLASSIFY)
    return engine


def message_ids(engine: Engine, queue: str) -> list[int]:
    return [m["msg_id"] for m in engine.queued_messages(queue)]


def start_tasks(engine: Engine, *args: object) -> None:
    placeholders = ", ".join(["%s"] * (len(args) + 3))
    engine.conn.execute(
        f"select * from pgflow.start_tasks({placeholders})",
        ("threads", message_ids(engine, CLASSIFY), WORKER_ID, *args),
    )


def test_two_steps_on_two_private_queues_complete_one_run(threads: Engine) -> None:
    run_id = threads.start("threads", {"text": "help me"})
    [first] = threads.poll("threads", CLASSIFY, step="classify")
    assert first.flow_input == {"text": "help me"}
    threads.complete(first, {"route": "help"})
    assert threads.queued_messages(CLASSIFY) == []  # deleted with the completion
    assert threads.archived_ids(CLASSIFY) == set()
    [second] = threads.poll("threads", DELIVER, step="deliverSlack")
    assert second.input == {"classify": {"route": "help"}}
    threads.complete(second, "sent")
    run = threads.run(run_id)
    assert (run["status"], run["output"]) == ("completed", {"deliverSlack": "sent"})
    assert [
        t["queue_name"]
        for t in threads.all("select queue_name from pgflow.step_tasks order by queue_name")
    ] == [CLASSIFY, DELIVER]


def test_an_exact_eligible_task_is_claimed_once(threads: Engine) -> None:
    run_id = threads.start("threads")
    ids = message_ids(threads, CLASSIFY)
    assert len(threads.claim("threads", ids, CLASSIFY, step="classify")) == 1
    assert threads.claim("threads", ids, CLASSIFY, step="classify") == []
    assert threads.task(run_id, "classify")["attempts_count"] == 1


def test_a_visible_again_started_task_is_not_claimed_and_consumes_no_attempt(
    threads: Engine,
) -> None:
    run_id = threads.start("threads")
    [task] = threads.poll("threads", CLASSIFY, step="classify")
    threads.make_visible(CLASSIFY)
    assert threads.poll("threads", CLASSIFY, step="classify") == []
    state = threads.task(run_id, "classify")
    assert (state["status"], state["attempts_count"]) == ("started", 1)
    threads.complete(task, {"route": "x"})
    assert threads.task(run_id, "classify")["status"] == "completed"


def test_a_terminal_task_is_not_revived(threads: Engine) -> None:
    run_id = threads.start("threads")
    [task] = threads.poll("threads", CLASSIFY, step="classify")
    threads.complete(task, {})
    assert threads.claim("threads", [task.msg_id], CLASSIFY, step="classify") == []
    assert threads.task(run_id, "classify")["status"] == "completed"


def test_a_message_of_another_step_is_left_untouched(threads: Engine) -> None:
    run_id = threads.start("threads")
    [task] = threads.poll("threads", CLASSIFY, step="classify")
    threads.complete(task, {})
    deliver_ids = message_ids(threads, DELIVER)
    # The ids of the other step's queue, presented with this step's selector and queue.
    assert threads.claim("threads", deliver_ids, CLASSIFY, step="classify") == []
    assert threads.task(run_id, "deliverSlack")["status"] == "queued"


def test_a_mixed_batch_claims_only_the_valid_messages(threads: Engine) -> None:
    run_id = threads.start("threads")
    foreign = threads.value("select pgmq.send(%s, '{\"hello\": 1}'::jsonb)", CLASSIFY)
    ids = [*message_ids(threads, CLASSIFY), 999_999]
    claimed = threads.claim("threads", ids, CLASSIFY, step="classify")
    assert [t.run_id for t in claimed] == [run_id]
    assert foreign in message_ids(threads, CLASSIFY)


@pytest.mark.parametrize(
    ("selector", "queue", "error"),
    [
        (None, CLASSIFY, "needs the step slug"),
        ("unknown", CLASSIFY, 'has no step "unknown"'),
        ("Classify", CLASSIFY, 'has no step "Classify"'),
        ("classify", DELIVER, 'is routed to queue "threads__classify"'),
        ("classify", "THREADS__CLASSIFY", 'is routed to queue "threads__classify"'),
    ],
    ids=["missing", "unknown", "wrong-case", "wrong-route", "non-canonical-queue"],
)
def test_a_wrong_selector_raises_and_changes_nothing(
    threads: Engine, selector: str | None, queue: str, error: str
) -> None:
    run_id = threads.start("threads")
    before = threads.task(run_id, "classify")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=error):
        start_tasks(threads, queue, selector)
    assert threads.task(run_id, "classify") == before


def test_a_wrong_case_selector_suggests_the_exact_slug(threads: Engine) -> None:
    threads.start("threads")
    with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
        start_tasks(threads, CLASSIFY, "Classify")
    assert raised.value.diag.message_detail == 'Step slugs match exactly; did you mean "classify"?'


def test_flow_mode_rejects_a_step_selector_and_keeps_four_argument_calls(engine: Engine) -> None:
    engine.flow("plain", {"slug": "only"})
    run_id = engine.start("plain")
    ids = [m["msg_id"] for m in engine.queued_messages("plain")]
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="takes no step slug"):
        engine.claim("plain", ids, "plain", step="only")
    assert engine.task(run_id, "only")["status"] == "queued"
    assert len(engine.claim("plain", ids, "plain")) == 1


def test_an_unknown_flow_raises(engine: Engine) -> None:
    engine.flow("somewhere", {"slug": "a"})
    with pytest.raises(psycopg.errors.NoDataFound, match='Flow "nowhere" does not exist'):
        engine.claim("nowhere", [1], "somewhere")

from __future__ import annotations

import pytest

from tests.engine import Engine


def test_queues_the_task_again_while_attempts_remain(engine: Engine) -> None:
    engine.flow("retry", {"slug": "flaky"}, max_attempts=3)
    run_id = engine.start("retry")
    [task] = engine.poll("retry")
    row = engine.fail(task, "network down")
    assert (row["status"], row["error_message"], row["attempts_count"]) == (
        "queued",
        "network down",
        1,
    )
    assert row["started_at"] is None
    assert engine.state(run_id, "flaky")["status"] == "started"


def test_hides_the_retry_for_base_delay_times_two_to_the_attempts(engine: Engine) -> None:
    engine.flow("retry", {"slug": "flaky", "base_delay": 3}, max_attempts=5)
    engine.start("retry")
    delays = []
    for _ in range(2):
        [task] = engine.poll("retry")
        engine.fail(task)
        delays.append(
            float(engine.value("select extract(epoch from vt - now()) from pgmq.q_retry"))
        )
        engine.make_visible("retry")
    assert 5 < delays[0] <= 6
    assert 11 < delays[1] <= 12


def test_a_zero_base_delay_retries_at_once(engine: Engine) -> None:
    engine.flow("retry", {"slug": "flaky", "base_delay": 0}, max_attempts=2)
    engine.start("retry")
    [task] = engine.poll("retry")
    engine.fail(task)
    assert len(engine.poll("retry")) == 1


def test_retries_then_succeeds(engine: Engine) -> None:
    engine.flow("retry", {"slug": "flaky", "base_delay": 0}, max_attempts=3)
    run_id = engine.start("retry")
    for _ in range(2):
        [task] = engine.poll("retry")
        engine.fail(task)
    [task] = engine.poll("retry")
    engine.complete(task, "finally")
    assert engine.run(run_id)["output"] == {"flaky": "finally"}
    assert engine.task(run_id, "flaky")["attempts_count"] == 3


def test_max_attempts_counts_the_first_attempt(engine: Engine) -> None:
    engine.flow("once", {"slug": "only", "max_attempts": 1})
    run_id = engine.start("once")
    [task] = engine.poll("once")
    assert engine.fail(task)["status"] == "failed"
    assert engine.run(run_id)["status"] == "failed"


def test_exhausted_with_fail_fails_step_and_run_and_cancels_the_rest(engine: Engine) -> None:
    engine.flow(
        "failing",
        {"slug": "bad", "max_attempts": 1},
        {"slug": "slow"},
        {"slug": "after", "deps_slugs": ["slow"]},
    )
    run_id = engine.start("failing")
    tasks = {t.step_slug: t for t in engine.poll("failing", qty=1)}
    bad = tasks.get("bad") or engine.poll("failing")[0]
    engine.fail(bad, "exploded")
    assert engine.state(run_id, "bad")["status"] == "failed"
    assert engine.state(run_id, "bad")["error_message"] == "exploded"
    run = engine.run(run_id)
    assert (run["status"], run["output"]) == ("failed", None)
    assert run["failed_at"] is not None
    assert engine.task(run_id, "slow")["status"] == "cancelled"
    assert engine.queued_messages("failing") == []
    assert engine.state(run_id, "after")["status"] == "created"


def test_exhausted_with_skip_skips_the_step_and_continues(engine: Engine) -> None:
    engine.flow(
        "optional",
        {"slug": "enrich", "max_attempts": 1, "when_exhausted": "skip"},
        {"slug": "base"},
        {"slug": "report", "deps_slugs": ["enrich", "base"]},
    )
    run_id = engine.start("optional")
    for task in engine.poll("optional"):
        if task.step_slug == "enrich":
            engine.fail(task, "api down")
        else:
            engine.complete(task, "B")
    state = engine.state(run_id, "enrich")
    assert (state["status"], state["skip_reason"], state["error_message"]) == (
        "skipped",
        "handler_failed",
        "api down",
    )
    [report] = engine.poll("optional")
    assert report.input == {"base": "B"}
    engine.complete(report, "R")
    assert engine.run(run_id)["output"] == {"report": "R"}


def test_exhausted_with_skip_cascade_skips_everything_downstream(engine: Engine) -> None:
    engine.flow(
        "cascade",
        {"slug": "a", "max_attempts": 1, "when_exhausted": "skip-cascade"},
        {"slug": "b", "deps_slugs": ["a"]},
        {"slug": "c", "deps_slugs": ["b"]},
        {"slug": "other"},
    )
    run_id = engine.start("cascade")
    for task in engine.poll("cascade"):
        if task.step_slug == "a":
            engine.fail(task)
        else:
            engine.complete(task, "O")
    reasons = {s: engine.state(run_id, s)["skip_reason"] for s in "abc"}
    assert reasons == {"a": "handler_failed", "b": "dependency_skipped", "c": "dependency_skipped"}
    run = engine.run(run_id)
    assert (run["status"], run["output"]) == ("completed", {"other": "O"})


def test_a_skipped_map_step_skips_its_other_tasks_and_counts_once(engine: Engine) -> None:
    engine.flow(
        "maps",
        {"slug": "each", "step_type": "map", "max_attempts": 1, "when_exhausted": "skip"},
    )
    run_id = engine.start("maps", [1, 2, 3])
    first, second, third = engine.poll("maps")
    engine.fail(first)
    late = engine.fail(second)
    assert late["status"] == "skipped"
    assert [t["status"] for t in engine.tasks(run_id, "each")] == ["failed", "skipped", "skipped"]
    assert engine.queued_messages("maps") == []
    run = engine.run(run_id)
    assert (run["status"], run["remaining_steps"], run["output"]) == ("completed", 0, None)
    assert engine.complete(third, 3)["status"] == "skipped"


def test_a_late_failure_after_the_run_failed_keeps_the_task_cancelled(engine: Engine) -> None:
    engine.flow("pair", {"slug": "a", "max_attempts": 1}, {"slug": "b"})
    run_id = engine.start("pair")
    tasks = {t.step_slug: t for t in engine.poll("pair")}
    engine.fail(tasks["a"])
    assert engine.fail(tasks["b"])["status"] == "cancelled"
    assert engine.task(run_id, "b")["error_message"] is None


def test_failing_a_task_that_is_not_started_changes_nothing(engine: Engine) -> None:
    engine.flow("retry", {"slug": "flaky"})
    run_id = engine.start("retry")
    row = engine.call("fail_task", run_id, "flaky", 0, "too early")[0]
    assert (row["status"], row["attempts_count"], row["error_message"]) == ("queued", 0, None)


@pytest.mark.parametrize(
    ("base", "attempts", "delay"), [(1, 1, 2), (1, 2, 4), (5, 1, 10), (5, 3, 40), (0, 4, 0)]
)
def test_calculate_retry_delay_doubles_per_attempt(
    engine: Engine, base: int, attempts: int, delay: int
) -> None:
    assert engine.value("select pgflow.calculate_retry_delay(%s, %s)", base, attempts) == delay


def test_calculate_retry_delay_saturates_instead_of_overflowing(engine: Engine) -> None:
    assert engine.value("select pgflow.calculate_retry_delay(5, 60)") == 2147483647


def test_a_skip_cascade_from_a_map_archives_its_siblings_messages(engine: Engine) -> None:
    engine.flow(
        "maps",
        {"slug": "each", "step_type": "map", "max_attempts": 1, "when_exhausted": "skip-cascade"},
        {"slug": "after", "deps_slugs": ["each"]},
    )
    run_id = engine.start("maps", [1, 2, 3])
    first, second, third = engine.poll("maps")
    engine.fail(first)
    assert engine.queued_messages("maps") == []
    assert {second.msg_id, third.msg_id} <= engine.archived_ids("maps")
    assert engine.state(run_id, "after")["skip_reason"] == "dependency_skipped"
    assert engine.run(run_id)["status"] == "completed"


def test_a_retry_whose_message_was_removed_is_a_final_failure(engine: Engine) -> None:
    engine.flow("gone", {"slug": "only", "max_attempts": 3})
    run_id = engine.start("gone")
    [task] = engine.poll("gone")
    engine.conn.execute("select pgmq.delete('gone', %s::bigint)", (task.msg_id,))
    assert engine.fail(task, "lost")["status"] == "failed"
    assert engine.run(run_id)["status"] == "failed"


def test_a_permanent_failure_is_not_retried_whatever_attempts_are_left(engine: Engine) -> None:
    engine.flow("retry", {"slug": "flaky"}, max_attempts=5)
    run_id = engine.start("retry")
    [task] = engine.poll("retry")
    [row] = engine.call(
        "fail_task",
        task.run_id,
        task.step_slug,
        task.task_index,
        "CardDeclined: no\n\nTraceback (most recent call last): ...",
        task.attempt,
        permanent_reason="the handler raised CardDeclined, a PermanentError",
    )
    assert (row["status"], row["attempts_count"]) == ("failed", 1)
    assert row["error_message"] == (
        "CardDeclined: no\n"
        "Not retried (attempt 1 of 5): the handler raised CardDeclined, a PermanentError\n"
        "\nTraceback (most recent call last): ..."
    )
    assert engine.state(run_id, "flaky")["error_message"] == row["error_message"]
    assert engine.run(run_id)["status"] == "failed"
    assert engine.poll("retry") == []


def test_a_permanent_failure_of_a_step_that_may_be_skipped_skips_it(engine: Engine) -> None:
    engine.flow(
        "optional",
        {"slug": "extra", "when_exhausted": "skip"},
        {"slug": "after", "deps_slugs": ["extra"]},
        max_attempts=3,
    )
    run_id = engine.start("optional")
    [task] = engine.poll("optional")
    engine.call("fail_task", task.run_id, task.step_slug, 0, "no", task.attempt, "it never works")
    state = engine.state(run_id, "extra")
    assert (state["skip_reason"], state["error_message"]) == (
        "handler_failed",
        "no\nNot retried (attempt 1 of 3): it never works",
    )
    [after] = engine.poll("optional")
    assert after.step_slug == "after"


def test_a_failure_without_a_permanent_reason_is_retried_as_before(engine: Engine) -> None:
    engine.flow("retry", {"slug": "flaky"}, max_attempts=2)
    engine.start("retry")
    [task] = engine.poll("retry")
    [row] = engine.call("fail_task", task.run_id, "flaky", 0, "boom", task.attempt, None)
    assert (row["status"], row["error_message"]) == ("queued", "boom")

from __future__ import annotations

import psycopg
import pytest

from tests.engine import WORKER_ID, Engine

CHAIN = ({"slug": "first"}, {"slug": "second", "deps_slugs": ["first"]})


def test_claims_a_queued_task_once_and_counts_the_attempt(engine: Engine) -> None:
    engine.flow("chain", *CHAIN)
    run_id = engine.start("chain")
    [task] = engine.poll("chain")
    row = engine.task(run_id, "first")
    assert (row["status"], row["attempts_count"], row["last_worker_id"]) == (
        "started",
        1,
        WORKER_ID,
    )
    assert row["started_at"] is not None
    assert task.msg_id == row["message_id"]


def test_gives_a_root_step_the_run_input_as_flow_input(engine: Engine) -> None:
    engine.flow("chain", *CHAIN)
    engine.start("chain", {"user": 7})
    [task] = engine.poll("chain")
    assert (task.input, task.flow_input) == ({}, {"user": 7})


def test_gives_a_dependent_step_its_dependencies_outputs_only(engine: Engine) -> None:
    engine.flow("chain", *CHAIN)
    engine.start("chain", {"user": 7})
    [first] = engine.poll("chain")
    engine.complete(first, {"name": "Ada"})
    [second] = engine.poll("chain")
    assert (second.input, second.flow_input) == ({"first": {"name": "Ada"}}, None)


def test_sets_the_lease_to_the_step_timeout_plus_two_seconds(engine: Engine) -> None:
    engine.flow("lease", {"slug": "own", "timeout": 100}, {"slug": "inherited"}, timeout=40)
    engine.start("lease")
    tasks = engine.poll("lease", vt=1)
    assert len(tasks) == 2
    leases = engine.all(
        "select t.step_slug, extract(epoch from q.vt - t.started_at) as lease"
        " from pgflow.step_tasks t join pgmq.q_lease q on q.msg_id = t.message_id"
    )
    by_step = {r["step_slug"]: float(r["lease"]) for r in leases}
    assert 101.5 < by_step["own"] < 103
    assert 41.5 < by_step["inherited"] < 43


def test_does_not_claim_a_started_task_again_or_count_an_attempt(engine: Engine) -> None:
    engine.flow("chain", *CHAIN)
    run_id = engine.start("chain")
    [task] = engine.poll("chain")
    engine.make_visible("chain")
    assert engine.poll("chain") == []
    assert engine.task(run_id, "first")["attempts_count"] == 1
    assert task.task_index == 0


def test_does_not_revive_a_completed_task(engine: Engine) -> None:
    engine.flow("solo", {"slug": "only"})
    run_id = engine.start("solo")
    [task] = engine.poll("solo")
    engine.complete(task, 1)
    assert engine.claim("solo", [task.msg_id]) == []
    assert engine.task(run_id, "only")["status"] == "completed"


def test_ignores_message_ids_without_a_task(engine: Engine) -> None:
    engine.flow("solo", {"slug": "only"})
    engine.start("solo")
    assert engine.claim("solo", [999_999]) == []


def test_leaves_tasks_of_another_flow_untouched(engine: Engine) -> None:
    engine.flow("alpha", {"slug": "a"})
    engine.flow("beta", {"slug": "a"})
    alpha_run = engine.start("alpha")
    msg_ids = [m["msg_id"] for m in engine.queued_messages("alpha")]
    # Since engine 0020 a flow-mode claim names its own flow's queue, or is refused.
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match='uses queue "beta"'):
        engine.claim("beta", msg_ids, queue="alpha")
    assert engine.task(alpha_run, "a")["status"] == "queued"
    assert engine.task(alpha_run, "a")["attempts_count"] == 0


def test_only_claims_messages_of_the_queue_it_was_given(engine: Engine) -> None:
    engine.flow("alpha", {"slug": "a"})
    engine.flow("beta", {"slug": "b"})
    engine.start("alpha")
    [message] = engine.queued_messages("alpha")
    engine.call("create_flow", "gamma")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match='not "gamma"'):
        engine.claim("alpha", [message["msg_id"]], queue="gamma")
    assert engine.claim("alpha", [message["msg_id"]], queue="alpha") != []


def test_requires_the_queue_name(engine: Engine) -> None:
    engine.flow("solo", {"slug": "only"})
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="needs the queue"):
        engine.conn.execute(
            "select * from pgflow.start_tasks('solo', array[1]::bigint[], %s, null)", (WORKER_ID,)
        )


def test_returns_nothing_for_an_empty_batch(engine: Engine) -> None:
    engine.flow("solo", {"slug": "only"})
    assert engine.claim("solo", []) == []


def test_undoes_the_whole_claim_when_a_message_is_missing(engine: Engine) -> None:
    engine.flow("pair", {"slug": "a"}, {"slug": "b"})
    run_id = engine.start("pair")
    ids = [m["msg_id"] for m in engine.queued_messages("pair")]
    engine.conn.execute("select pgmq.delete('pair', %s::bigint)", (ids[0],))
    with pytest.raises(psycopg.errors.RaiseException, match="missing from queue"):
        engine.claim("pair", ids)
    assert {t["status"] for t in engine.tasks(run_id, "a") + engine.tasks(run_id, "b")} == {
        "queued"
    }


def test_does_not_claim_tasks_of_a_failed_run(engine: Engine) -> None:
    engine.flow("pair", {"slug": "a", "max_attempts": 1}, {"slug": "b"})
    engine.start("pair")
    ids = [m["msg_id"] for m in engine.queued_messages("pair")]
    [a] = [t for t in engine.claim("pair", ids[:1])]
    engine.fail(a)
    assert engine.claim("pair", ids[1:]) == []


def test_claims_each_task_of_a_batch_with_its_own_input(engine: Engine) -> None:
    engine.flow("fan", {"slug": "a"}, {"slug": "b"}, {"slug": "c"})
    engine.start("fan", {"n": 1})
    tasks = engine.poll("fan")
    assert sorted(t.step_slug for t in tasks) == ["a", "b", "c"]
    assert all(t.flow_input == {"n": 1} for t in tasks)


def test_rejects_a_worker_that_is_not_registered(engine: Engine) -> None:
    engine.flow("solo", {"slug": "only"})
    engine.start("solo")
    [message] = engine.queued_messages("solo")
    with pytest.raises(psycopg.errors.NoDataFound, match="is not registered"):
        engine.conn.execute(
            "select * from pgflow.start_tasks('solo', %s, gen_random_uuid(), 'solo')",
            ([message["msg_id"]],),
        )


def test_accepts_the_queue_name_in_any_case(engine: Engine) -> None:
    engine.flow("Solo", {"slug": "only"})
    engine.start("Solo")
    [message] = engine.queued_messages("solo")
    assert len(engine.claim("Solo", [message["msg_id"]], queue="Solo")) == 1


def test_skips_a_task_locked_by_another_transaction_without_waiting(
    engine: Engine, db_url: str
) -> None:
    engine.flow("pair", {"slug": "a"}, {"slug": "b"})
    run_id = engine.start("pair")
    ids = [m["msg_id"] for m in engine.queued_messages("pair")]
    with psycopg.connect(db_url) as other:
        other.execute(
            "select 1 from pgflow.step_tasks where run_id = %s and step_slug = 'a' for update",
            (run_id,),
        )
        claimed = engine.claim("pair", ids)
        other.rollback()
    assert [t.step_slug for t in claimed] == ["b"]
    assert engine.task(run_id, "a")["status"] == "queued"


def test_two_claims_on_one_queue_do_not_wait_for_each_other(engine: Engine, db_url: str) -> None:
    engine.flow("busy", {"slug": "a"}, {"slug": "b"})
    engine.start("busy")
    engine.start("busy")
    tasks = engine.poll("busy", qty=1)
    engine.complete(tasks[0], 1)
    ids = [m["msg_id"] for m in engine.queued_messages("busy")]
    with psycopg.connect(db_url) as first:
        first.execute(
            "select * from pgflow.start_tasks('busy', %s, %s, 'busy')", (ids[1:2], WORKER_ID)
        )  # first claim open, holding its rows
        engine.conn.execute("set lock_timeout = '2s'")
        claimed = engine.claim("busy", ids[2:3])
        first.rollback()
    assert len(claimed) == 1


def test_a_completed_tasks_message_is_deleted_and_never_claimed_again(engine: Engine) -> None:
    engine.flow("reread", {"slug": "only"})
    run_id = engine.start("reread")
    [task] = engine.poll("reread")
    engine.complete(task, 1)
    engine.make_visible("reread")  # were it still in the queue, its lease would have run out
    assert engine.poll("reread") == []
    assert engine.task(run_id, "only")["attempts_count"] == 1
    assert engine.queued_messages("reread") == []
    assert engine.archived_ids("reread") == set()

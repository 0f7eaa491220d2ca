"""claim_tasks and the messages it reads that no task can take: one of this flow whose task is
gone is archived (with a warning naming it), so it stops coming back after every lease; a
foreign or unreadable one is left alone."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from tests.engine import Engine

Notice = tuple[str | None, str | None, str | None]


def read_and_claim(engine: Engine, flow: str) -> tuple[list[Any], list[Notice]]:
    """Read and claim every visible message; the notices the claim sent (severity, message,
    detail: a notice's fields can be read only while its handler runs)."""
    notices: list[Notice] = []

    def note(diag: psycopg.errors.Diagnostic) -> None:
        notices.append((diag.severity_nonlocalized, diag.message_primary, diag.message_detail))

    engine.conn.add_notice_handler(note)
    try:
        engine.make_visible(flow.lower())
        return engine.poll(flow), notices
    finally:
        engine.conn.remove_notice_handler(note)


def send(engine: Engine, queue: str, message: Any) -> int:
    return int(engine.value("select pgmq.send(%s, %s)", queue, Jsonb(message)))


def test_a_message_whose_task_is_gone_is_archived_and_named(engine: Engine) -> None:
    engine.flow("lost", {"slug": "a"})
    gone = engine.start("lost")
    [orphan] = [m["msg_id"] for m in engine.queued_messages("lost")]
    for table in ("step_tasks", "step_states", "runs"):  # deleted by hand, as an old prune did
        engine.conn.execute(f"delete from pgflow.{table} where run_id = %s", (gone,))
    live = engine.start("lost")

    claimed, notices = read_and_claim(engine, "lost")
    assert [task.run_id for task in claimed] == [live]
    assert orphan in engine.archived_ids("lost")
    assert notices == [
        (
            "WARNING",
            'claim_tasks archived 1 message(s) of queue "lost" whose task no longer exists.',
            f'{{"archived_message_ids": [{orphan}]}}',
        )
    ]


def test_foreign_and_unreadable_messages_are_left_alone(engine: Engine) -> None:
    engine.flow("lost", {"slug": "a"})
    foreign = send(
        engine,
        "lost",
        {"flow_slug": "other", "run_id": "00000000-0000-0000-0000-000000000001",
         "step_slug": "a", "task_index": 0},
    )  # fmt: skip
    unreadable = [
        send(engine, "lost", {"hello": "world"}),
        send(engine, "lost", {"flow_slug": "lost", "run_id": "not-a-uuid", "step_slug": "a",
                              "task_index": 0}),
        send(engine, "lost", {"flow_slug": "lost", "run_id": "00000000-0000-0000-0000-000000000001",
                              "step_slug": "a", "task_index": "1.5"}),
    ]  # fmt: skip

    claimed, notices = read_and_claim(engine, "lost")
    assert claimed == []
    assert notices == []
    queued = {m["msg_id"] for m in engine.queued_messages("lost")}
    assert queued == {foreign, *unreadable}

"""Every operator's hand is on the record (engine 0020): `pgflow-gen cancel`, `retry`, `signal`,
`pause`, `resume`, `limits` and `schedules pause`/`resume` each leave a row in
`pgflow.operator_actions` that the engine writes itself, with the login role that acted (a client
or an admin here) and the CLI's label beside it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.harness import Db, run_cli
from tests.roles import Logins

STEPS: list[dict[str, Any]] = [
    {"slug": "prep"},
    {"slug": "gate", "deps": ["prep"], "stepType": "signal"},
]
NIGHTLY = {"name": "nightly", "cron": "0 2 * * *", "timezone": "UTC", "input": {},
           "catchUp": "none"}  # fmt: skip


def test_each_cli_action_is_recorded_with_the_login_role_that_acted(
    db: Db, logins: Logins, capsys: pytest.CaptureFixture[str]
) -> None:
    db.compile("audit", STEPS, mode="flow", options={"maxAttempts": 1}, schedules=[NIGHTLY])
    cancelled, failed, waiting = (db.start("audit", {"n": n}) for n in range(3))
    for task in db.poll("audit"):
        if task.run_id == failed:
            db.fail(task, "broken", fenced=True)
        elif task.run_id == waiting:
            db.complete(task, {"ok": True}, fenced=True)
    client = logins.url_of(logins.login_role("client"))
    admin = logins.url_of(logins.login_role("admin"))

    for url, args in [
        (client, ["cancel", str(cancelled), "--reason", "duplicate", "--yes"]),
        (client, ["retry", str(failed)]),
        (client, ["signal", str(waiting), "gate", "--payload", '{"approved": true}']),
        (admin, ["pause", "audit", "prep", "--reason", "upstream down"]),
        (admin, ["resume", "audit", "prep"]),
        (admin, ["limits", "audit", "prep", "--max-in-flight", "2"]),
        (admin, ["schedules", "pause", "audit", "nightly"]),
        (admin, ["schedules", "resume", "audit", "nightly"]),
    ]:
        code, _, err = run_cli(capsys, url, *args)
        assert (code, err) == (0, ""), args

    rows = db.all(
        "select action, actor, label, run_id, step_slug, detail from pgflow.operator_actions"
        " order by action_id"
    )
    who = {logins.login_role("client"): "client", logins.login_role("admin"): "admin"}
    assert [(r["action"], who[r["actor"]], r["run_id"], r["step_slug"]) for r in rows] == [
        ("cancel", "client", cancelled, None),
        ("retry", "client", failed, None),
        ("signal", "client", waiting, "gate"),
        ("pause", "admin", None, "prep"),
        ("resume", "admin", None, "prep"),
        ("limits", "admin", None, "prep"),
        ("pause_schedule", "admin", None, None),
        ("resume_schedule", "admin", None, None),
    ]
    assert all(r["label"].startswith("pgflow-gen (") for r in rows), rows
    assert rows[0]["detail"] == {"reason": "duplicate"}
    assert rows[5]["detail"] == {"max_in_flight": 2, "rate_limit": None, "rate_period_s": None}
    assert rows[6]["detail"] == {"schedule": "nightly"}

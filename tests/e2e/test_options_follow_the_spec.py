"""Options follow the spec: edit a flow's and a step's retries, delays and timeouts in the YAML,
rebuild, apply the generated migration, and a worker enforces the new values, with no recompile
and no run lost. Runs `pgflow-gen build`, `pgflow-gen db apply` and a generated entry file."""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.e2e.harness import PROJECT, Db, Workers

SPEC = "flows/timeouts.yaml"
ORIGINAL_OPTIONS = "options: {max_attempts: 2, base_delay: 1, timeout: 3}"
EDITED_OPTIONS = "options: {max_attempts: 1, base_delay: 2, timeout: 4}"
SLOW_SYNC = "  - slug: slowSync\n"
SLOW_SYNC_EDITED = "  - slug: slowSync\n    options: {timeout: 6, start_delay: 1}\n"


def cli(project: Path, db_url: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pgflow_gen.cli", *args],
        cwd=project,
        env={**os.environ, "PGFLOW_DATABASE_URL": db_url},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_edited_options_are_applied_by_the_migration_and_enforced_by_the_worker(
    db: Db, db_url: str, tmp_path: Path, workers: Workers
) -> None:
    project = tmp_path / "project"
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns("__pycache__"))
    assert "compiled" in cli(project, db_url, "db", "apply", "app/pgflow")
    before = db.start("e2eTimeouts", {"seconds": 0.1, "marks": str(tmp_path)})

    spec = project / SPEC
    text = spec.read_text()
    assert ORIGINAL_OPTIONS in text
    assert SLOW_SYNC in text
    spec.write_text(
        text.replace(ORIGINAL_OPTIONS, EDITED_OPTIONS).replace(SLOW_SYNC, SLOW_SYNC_EDITED)
    )
    cli(project, db_url, "build", "flows", "--out", "app/pgflow")
    applied = cli(project, db_url, "db", "apply", "app/pgflow")
    assert (
        "flow e2eTimeouts verified; options updated: flow maxAttempts 2 -> 1, flow baseDelay"
        ' 1 -> 2, flow timeout 3 -> 4, step "slowSync" timeout the flow\'s -> 6,'
        ' step "slowSync" startDelay the flow\'s -> 1'
    ) in applied
    assert db.one(
        "select opt_max_attempts, opt_base_delay, opt_timeout from pgflow.flows"
        " where flow_slug = 'e2eTimeouts'"
    ) == {
        "opt_max_attempts": 1,
        "opt_base_delay": 2,
        "opt_timeout": 4,
    }

    shown = cli(project, db_url, "flows", "--flow", "e2eTimeouts").splitlines()
    assert [line.split() for line in shown] == [
        ["flow", "mode", "step", "type", "queue", "max", "attempts", "base", "delay", "timeout",
         "start", "delay"],
        ["-" * len(word) for word in shown[1].split()],
        ["e2eTimeouts", "flow", "slowSync", "single", "e2etimeouts", "1", "(flow)", "2",
         "(flow)", "6", "1"],
        ["e2eTimeouts", "flow", "slowAsync", "single", "e2etimeouts", "1", "(flow)", "2",
         "(flow)", "4", "(flow)", "0", "(flow)"],
    ]  # fmt: skip

    worker = workers.start("e2e_timeouts", "worker", cwd=project).started()
    assert "flow e2eTimeouts verified" in worker.log()  # the options are already the spec's
    assert db.finished(before)["status"] == "completed"  # the run started before is kept
    run_id = db.start("e2eTimeouts", {"seconds": 12, "marks": str(tmp_path)})
    assert db.finished(run_id)["status"] == "failed"
    tasks = {
        t["step_slug"]: t
        for t in db.all(
            "select step_slug, attempts_count, error_message, status, started_at, queued_at"
            " from pgflow.step_tasks where run_id = %s",
            run_id,
        )
    }
    failed = [t for t in tasks.values() if t["status"] == "failed"]
    assert failed  # the first step out of attempts failed the run
    for task in failed:
        assert task["attempts_count"] == 1  # max_attempts 1: no retry
        timeout = 6 if task["step_slug"] == "slowSync" else 4
        assert task["error_message"].startswith(
            f'HandlerTimeoutError: Step "{task["step_slug"]}" ran past its timeout of {timeout} s'
        )
    sync = tasks["slowSync"]  # start_delay 1: claimed after a second, before slowAsync's 4 s
    assert sync["started_at"] - sync["queued_at"] >= datetime.timedelta(seconds=1)

    # A worker built from a newer spec applies its options when it starts, and says so.
    spec.write_text(spec.read_text().replace(EDITED_OPTIONS, EDITED_OPTIONS.replace("4}", "5}")))
    cli(project, db_url, "build", "flows", "--out", "app/pgflow")
    newer = workers.start("e2e_timeouts", "worker", cwd=project).started()
    assert "flow e2eTimeouts verified; options updated: flow timeout 4 -> 5" in newer.log()

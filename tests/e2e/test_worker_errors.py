"""Every worker error `docs/errors.md` describes, run as a generated entry file in its own
process: a worker that cannot start exits 1 with one ERROR line (the error's class and message)
and its hint, and no traceback; an error a task stores is the documented text. The bad database
URL and the handler that does not import have their own file (`test_bad_configuration.py`)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.e2e.harness import PROJECT, Db, WorkerProcess, Workers, eventually

MIGRATION = PROJECT / "app" / "pgflow" / "migrations" / "e2ePlain.sql"


def refusal(worker: WorkerProcess) -> tuple[str, list[str]]:
    """The one ERROR line of a worker that exited 1, and the lines after it."""
    assert worker.wait() == 1, worker.log()
    lines = worker.log().splitlines()
    errors = [index for index, line in enumerate(lines) if " ERROR " in line]
    assert len(errors) == 1, lines
    assert "Traceback" not in worker.log()
    return lines[errors[0]].split(" ERROR pgflow_gen.worker: ", 1)[1], lines[errors[0] + 1 :]


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--max-concurrent", "0"], {}, "Invalid value '0' for --max-concurrent."),
        ([], {"PGFLOW_MAX_CONCURRENT": "abc"}, "Invalid value 'abc' for PGFLOW_MAX_CONCURRENT."),
        (["--shutdown-grace", "-1"], {}, "Invalid value '-1' for --shutdown-grace."),
    ],
    ids=["option", "environment", "grace"],
)
def test_a_worker_option_out_of_range_is_a_config_error(
    workers: Workers, args: list[str], env: dict[str, str], message: str
) -> None:
    error, after = refusal(workers.start("e2e_plain", "worker", *args, **env))
    assert error == f"ConfigError: {message}"
    assert after[0].startswith("HINT: It must be ")


def test_a_database_without_the_engine_says_to_migrate(workers: Workers, empty_db_url: str) -> None:
    worker = workers.start("e2e_plain", "worker", PGFLOW_DATABASE_URL=empty_db_url)
    error, after = refusal(worker)
    assert error == "DatabaseError: The database has no pgflow engine (or an older one)."
    assert "HINT: Run `pgflow-gen db migrate` against this database first." in after


def compile_changed(db_url: str, old: str, new: str) -> None:
    """Compile e2ePlain as its generated migration does, with one change."""
    sql = MIGRATION.read_text()
    assert old in sql
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(sql.replace(old, new))


def test_a_flow_with_another_shape_in_the_database_is_refused(
    workers: Workers, db: Db, db_url: str
) -> None:
    compile_changed(db_url, '"slug": "wrap_up"', '"slug": "wrapUp"')
    error, after = refusal(workers.start("e2e_plain", "worker"))
    assert error.startswith('FlowShapeMismatchError: Flow "e2ePlain" differs from its definition')
    assert after[0] == 'DETAIL: Step at index 1: slug differs "wrap_up" vs "wrapUp"'
    assert after[1].startswith("HINT: Flows are immutable in production: deploy the change under")
    assert "(for example e2ePlainV2)" in after[1]
    assert db.all("select count(*) as n from pgflow.runs")[0]["n"] == 0


def test_a_flow_with_other_queue_routes_in_the_database_is_refused(
    workers: Workers, db_url: str
) -> None:
    routes = (
        '\'[{"stepSlug": "shout", "queueName": "e2eplain__shout"},'
        ' {"stepSlug": "wrap_up", "queueName": "e2eplain__wrap_up"}]\'::jsonb'
    )
    compile_changed(db_url, "'flow',\n    null\n  );", f"'step',\n    {routes}\n  );")
    error, after = refusal(workers.start("e2e_plain", "worker"))
    assert error == (
        'FlowRoutingMismatchError: Flow "e2ePlain" differs from its definition in the database'
        " (routing)."
    )
    assert (
        after[0]
        == 'DETAIL: Queue mode of flow "e2ePlain" differs: expected "flow", persisted "step"'
    )
    assert after[-1] == (
        "HINT: Flows are immutable in production: deploy the change under a new flow slug"
        " (for example e2ePlainV2), or run against a local database."
    )


def test_an_output_of_the_wrong_type_fails_its_attempt_with_the_documented_error(
    workers: Workers, db: Db
) -> None:
    worker = workers.start("e2e_plain", "worker").started()
    run_id = db.start("e2ePlain", {"name": "a number, please"})

    def failed_once() -> dict[str, Any] | None:
        rows = db.all(
            "select status, attempts_count, error_message from pgflow.step_tasks"
            " where run_id = %s and step_slug = 'shout' and error_message is not null",
            run_id,
        )
        return rows[0] if rows else None

    task = eventually(failed_once, "the first attempt of shout to fail")
    assert task["error_message"] == (
        'OutputValidationError: Step "shout" returned an output that does not match its type:'
        " $: expected string, got integer."
    )
    assert task["status"] == "queued"  # it retries per the flow's policy (3 attempts)
    assert db.value("select status from pgflow.runs where run_id = %s", run_id) == "started"
    assert "attempt 1 failed: OutputValidationError: " in worker.log()

"""A worker entry file given a database URL no retry can fix exits 1 at once with one line that
names the problem (never a traceback, never the password); a real connection failure is still
retried. Each case runs a generated entry file as a process."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.harness import Workers


@pytest.fixture
def nowhere_workers(tmp_path: Path) -> Workers:
    return Workers("unused", tmp_path)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        (
            "postgresq://app:s3cret@localhost/app",
            'missing "=" after "postgresq://app:***@localhost/app" in connection info string',
        ),
        (
            "postgresql://app:s3cret@127.0.0.1:5432/app?sslmode=bogus",
            'invalid sslmode value: "bogus"',
        ),
        (
            "postgresql://app:s3cret@127.0.0.1:5432/app?port=abc",
            'invalid integer value "abc" for connection option "port"',
        ),
    ],
    ids=["malformed", "sslmode", "port"],
)
def test_a_bad_database_url_is_one_line_and_exit_1_at_once(
    nowhere_workers: Workers, url: str, problem: str
) -> None:
    try:
        worker = nowhere_workers.start("e2e_plain", "worker", PGFLOW_DATABASE_URL=url)
        assert worker.wait(deadline=20.0) == 1
        lines = worker.log().splitlines()
    finally:
        nowhere_workers.close()
    errors = [line for line in lines if " ERROR " in line]
    assert len(errors) == 1, lines
    assert errors[0].endswith(
        f"ERROR pgflow_gen.worker: ConfigError: The database URL is not valid: {problem}."
    )
    assert any(line.startswith("HINT: Check --database-url, PGFLOW_DATABASE_URL") for line in lines)
    assert "Traceback" not in "\n".join(lines)
    assert "s3cret" not in "\n".join(lines)
    assert not any("not reachable yet" in line for line in lines)


def test_a_server_that_is_not_there_yet_is_still_waited_for(nowhere_workers: Workers) -> None:
    try:
        worker = nowhere_workers.start(
            "e2e_plain", "worker", PGFLOW_DATABASE_URL="postgresql://app@127.0.0.1:1/app"
        )
        worker.wait_for_log("database not reachable yet")
    finally:
        nowhere_workers.close()

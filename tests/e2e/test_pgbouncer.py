"""Workers behind a transaction-pooling PgBouncer: no LISTEN (notifications off), no prepared
statements, and the long-poll fallback keeps every run moving.

Needs the `pgbouncer` binary (Debian package `pgbouncer`); `.ci/run` installs it and runs this
module with `-m pgbouncer` (plain `make test` leaves it out)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import Jsonb

from pgflow_gen.runtime import Client
from tests.e2e.harness import Db, Workers, eventually
from tests.e2e.project.app.pgflow import e2e_plain

pytestmark = pytest.mark.pgbouncer


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def bouncer_url(db_url: str) -> Iterator[str]:
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    assert Path(binary).exists(), "install pgbouncer (apt-get install pgbouncer) for this test"
    params = conninfo_to_dict(db_url)
    folder = Path(tempfile.mkdtemp(prefix="pgflow-pgbouncer-"))
    folder.chmod(0o777)  # pgbouncer refuses to run as root; it switches to a service user
    port = free_port()
    config = folder / "pgbouncer.ini"
    config.write_text(
        "[databases]\n"
        f"* = host={params['host']} port={params.get('port', 5432)} user={params['user']}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        "auth_type = any\npool_mode = transaction\ndefault_pool_size = 20\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
        f"logfile = {folder / 'pgbouncer.log'}\npidfile = {folder / 'pgbouncer.pid'}\n"
    )
    config.chmod(0o644)
    command = [binary, str(config)]
    if os.geteuid() == 0:
        command[1:1] = ["-u", "pgserver"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = make_conninfo(
        "", host="127.0.0.1", port=str(port), dbname=params["dbname"], user=params["user"]
    )

    def accepting() -> bool:
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    try:
        eventually(accepting, "pgbouncer to listen", deadline=30)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)


def test_workers_behind_a_transaction_pooler_complete_every_run(
    bouncer_url: str, db: Db, tmp_path: Path
) -> None:
    workers = Workers(bouncer_url, tmp_path)
    settings = {
        "PGFLOW_NOTIFICATIONS": "off",
        "PGFLOW_PREPARED_STATEMENTS": "off",
        "PGFLOW_POLL_INTERVAL": "0.25",
    }
    try:
        for entry in ("first", "second", "side"):
            workers.start("e2e_steps", entry, **settings).started()
        run_ids = [db.start("e2eSteps", {"n": n}) for n in range(20)]
        for n, run_id in enumerate(run_ids):
            run = db.finished(run_id)
            assert run["output"] == {"second": (n + 1) * 2, "side": f"side {n}"}
        for worker in workers:
            assert "insert notifications off" in worker.log()
    finally:
        workers.close()


def test_a_client_behind_a_transaction_pooler_reuses_its_connections(
    bouncer_url: str, db: Db
) -> None:
    # Its pooled connections run each statement many times, unprepared (test_client.py checks
    # that): PgBouncer before 1.21 in transaction mode cannot keep prepared statements.
    flow = e2e_plain.FLOW
    db.value("select pgflow.ensure_flow_compiled(%s, %s)", flow.slug, Jsonb(flow.shape()))
    with Client(bouncer_url, pool_size=1) as client:
        runs = [client.start_flow(flow, e2e_plain.Input(name=f"n{n}")) for n in range(12)]
        assert [client.get_run(run.run_id).status for run in runs] == ["started"] * 12

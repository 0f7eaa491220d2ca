"""`make demo` runs its 50 runs to the end and says that it leaves the embedded PostgreSQL
running, and how to stop it (run here on an embedded server of its own, in a new folder)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pgflow_gen.runtime import embedded

DEMO = Path(__file__).resolve().parents[2] / "examples" / "community_threads" / "demo.py"


def test_the_demo_finishes_its_runs_and_says_the_server_keeps_running(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PGFLOW_DATABASE_URL", "DATABASE_URL")}
    try:
        done = subprocess.run(
            [sys.executable, str(DEMO)], cwd=tmp_path, env=env, capture_output=True, text=True,
            check=False, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert "statuses {'completed': 50}" in done.stdout
        assert "exit codes: {" in done.stdout
        assert set(done.stdout.split("exit codes: ", 1)[1].split("}", 1)[0][1:].split(", ")) == {
            f"'communityThreadsV1-{name}': 0"
            for name in ("classify", "deliverSlack", "listHelpers", "thankHelpers")
        }
        # It names the pgflow-gen it ran, which works without an activated environment.
        command = Path(sys.executable).parent / "pgflow-gen"
        assert command.is_file()
        assert done.stdout.rstrip().endswith(
            f"The embedded PostgreSQL of {tmp_path} keeps running, for the next `make demo` or"
            f" `pgflow-gen` command; stop it with `{command} db stop` from {tmp_path}."
        )
        assert "Traceback" not in done.stderr
    finally:
        embedded.EmbeddedServer.for_project(tmp_path).destroy()

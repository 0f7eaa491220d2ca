"""The `dev` supervisor's output and its stop: the prefix column has one width from the first
line on, and while it stops its processes it can say which it still waits for, and for how
long. Real child processes."""

from __future__ import annotations

import io
import os
import sys
import threading

from pgflow_gen.cli.supervisor import Supervisor
from tests.e2e.harness import eventually

# Ignores SIGTERM and says so, then sleeps: a worker whose handlers still run. Its word is
# built as it runs: the supervisor's own "started slow (pid ...): <command>" line must not
# contain it, or the test would signal the child before it ignores SIGTERM.
STUBBORN = (
    f'{sys.executable} -c "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);'
    " print('rea' + 'dy', flush=True); time.sleep(60)\""
)


def test_the_prefix_column_keeps_one_width_from_the_first_line() -> None:
    out = io.StringIO()
    supervisor = Supervisor(cwd=os.getcwd(), env=os.environ, out=out)
    supervisor.expect(["hello-greet", "orders-notifyCustomer"])
    supervisor.say("database postgresql://...")
    supervisor.say("engine is current", name="hello-greet")
    first, second = out.getvalue().splitlines()
    assert first.index("|") == second.index("|")
    assert first.split()[1:3] == ["dev", "|"]
    assert first.index("|") - first.index("dev") == len("orders-notifyCustomer") + 1


def test_while_stopping_it_says_which_processes_it_waits_for_and_how_long() -> None:
    out = io.StringIO()
    supervisor = Supervisor(cwd=os.getcwd(), env=os.environ, out=out)
    assert supervisor.waiting_for() == ([], 0.0)
    supervisor.start("slow", STUBBORN)
    eventually(lambda: "ready" in out.getvalue() or None, "the child's first line")
    statuses: dict[str, int | None] = {}
    stopping = threading.Thread(target=lambda: statuses.update(supervisor.stop_all(30.0)))
    stopping.start()
    try:
        names, left = eventually(lambda: supervisor.waiting_for() if supervisor.waiting_for()[0]
                                 else None, "the stop to wait for the child")  # fmt: skip
        assert names == ["slow"]
        assert 0 < left <= 30.0
    finally:
        for child in list(supervisor._stopping):
            child.popen.kill()  # the grace need not run out for the test
        stopping.join(timeout=30)
    assert statuses["slow"] is not None
    assert supervisor.waiting_for() == ([], 0.0)

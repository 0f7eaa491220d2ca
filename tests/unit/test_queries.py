"""The runtime's statements live in `runtime/queries.py`, by name: the modules that run tasks,
the client and the engine migrations spell no SQL of their own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pgflow_gen
from pgflow_gen.runtime import queries

PACKAGE = Path(pgflow_gen.__file__).parent
WORKER_MODULES = [
    "runtime/client.py",
    "runtime/context.py",
    "runtime/heartbeat.py",
    "runtime/listener.py",
    "runtime/migrations.py",
    "runtime/poller.py",
    "runtime/reporter.py",
    "runtime/reporting.py",
    "runtime/session.py",
    "runtime/slots.py",
    "runtime/sqlstate.py",
    "runtime/startup.py",
    "runtime/supervision.py",
    "runtime/task_runner.py",
    "runtime/worker.py",
    "runtime/worker_loop.py",
    "testing/runner.py",
]
STATEMENT = re.compile(r"^\s*(select|update|delete|with|insert into)\s", re.IGNORECASE)


def test_the_worker_modules_spell_no_statements() -> None:
    found = []
    for name in WORKER_MODULES:
        for node in ast.walk(ast.parse((PACKAGE / name).read_text())):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and STATEMENT.match(node.value)
            ):
                found.append(f"{name}:{node.lineno}: {node.value[:50]}")
    assert found == []


def test_every_named_query_is_used() -> None:
    names = [n for n in vars(queries) if n.isupper()]
    sources = "".join((PACKAGE / name).read_text() for name in WORKER_MODULES)
    assert [n for n in names if f"queries.{n}" not in sources] == []

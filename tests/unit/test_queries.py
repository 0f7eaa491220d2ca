"""Statements live in named modules: the runtime's in `runtime/queries.py` (the modules that run
tasks, the client and the engine migrations spell no SQL of their own), the command line's in
`cli/queries.py`, the dashboard's in `dashboard/queries.py`, and those several of them send in
`engine/statements.py`, each name defined once."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import pgflow_gen
from pgflow_gen.cli import queries as cli_queries
from pgflow_gen.dashboard import queries as dashboard_queries
from pgflow_gen.engine import statements
from pgflow_gen.runtime import queries

PACKAGE = Path(pgflow_gen.__file__).parent
WORKER_MODULES = [
    "runtime/client/client.py",
    "runtime/client/models.py",
    "runtime/client/refusals.py",
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
CLI_MODULES = sorted(
    str(path.relative_to(PACKAGE))
    for path in (PACKAGE / "cli").glob("*.py")
    if path.name != "queries.py"
)
DASHBOARD_MODULES = sorted(
    str(path.relative_to(PACKAGE))
    for path in (PACKAGE / "dashboard").glob("*.py")
    if path.name != "queries.py"
)
STATEMENT = re.compile(r"^\s*(select|update|delete|with|insert into)\s", re.IGNORECASE)


@pytest.mark.parametrize(
    "modules", [WORKER_MODULES, CLI_MODULES, DASHBOARD_MODULES], ids=["runtime", "cli", "dashboard"]
)
def test_the_modules_spell_no_statements(modules: list[str]) -> None:
    found = []
    for name in modules:
        for node in ast.walk(ast.parse((PACKAGE / name).read_text())):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and STATEMENT.match(node.value)
            ):
                found.append(f"{name}:{node.lineno}: {node.value[:50]}")
    assert found == []


@pytest.mark.parametrize(
    ("module", "prefix", "modules"),
    [
        (queries, "queries", WORKER_MODULES),
        (cli_queries, "cli_queries", CLI_MODULES),
        (dashboard_queries, "q", DASHBOARD_MODULES),
    ],
    ids=["runtime", "cli", "dashboard"],
)
def test_every_named_query_is_used(module: object, prefix: str, modules: list[str]) -> None:
    names = [n for n in vars(module) if n.isupper() and not n.startswith("_")]
    sources = "".join((PACKAGE / name).read_text() for name in modules)
    assert [n for n in names if f"{prefix}.{n}" not in sources] == []


def test_shared_statements_are_shared_and_no_name_is_defined_twice() -> None:
    callers = [*WORKER_MODULES, *CLI_MODULES, *DASHBOARD_MODULES]
    for name in [n for n in vars(statements) if n.isupper()]:
        users = [m for m in callers if f"statements.{name}" in (PACKAGE / m).read_text()]
        assert len({m.split("/")[0] for m in users}) >= 2, f"{name} is used only by {users}"
    defined: dict[str, list[str]] = {}
    for module in (queries, cli_queries, dashboard_queries, statements):
        for name in vars(module):
            if name.isupper():
                defined.setdefault(name, []).append(module.__name__)
    assert {n: m for n, m in defined.items() if len(m) > 1} == {}

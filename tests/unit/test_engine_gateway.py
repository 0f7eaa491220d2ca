"""Every statement pgflow-gen sends is spelled in the engine gateway (`pgflow_gen/engine/`), each
name defined once and sent by some part; no other module holds SQL text. The engine's own SQL
(`runtime/sql/`: its source, migrations and the tools that write them) is the other exception."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from types import ModuleType

import pytest

import pgflow_gen
from pgflow_gen.engine import (
    admin_statements,
    client_statements,
    dashboard_statements,
    operator_statements,
    statements,
    worker_statements,
)

PACKAGE = Path(pgflow_gen.__file__).parent
GATEWAY = PACKAGE / "engine"
ENGINE_SQL = PACKAGE / "runtime" / "sql"
STATEMENT_MODULES = [
    statements,
    worker_statements,
    client_statements,
    admin_statements,
    operator_statements,
    dashboard_statements,
]
#: The beginnings of the statements pgflow-gen sends (help texts such as "show a run" or
#: "create a project" do not match).
SQL = re.compile(
    r"""^\s*(
        select\s.*(\bfrom\b|\w\(|\bis\s+not\s+null\b) | select\s+\d+\s*$
      | insert\s+into\s | update\s+\S+\s+set\s | delete\s+from\s
      | with\s+(recursive\s+)?\w+\s*(\([^)]*\)\s*)?as\s*\(
      | (create|alter|drop)\s+(database|table|role|function|schema|index|extension|trigger)\b
      | grant\s.*\s(on|to)\s | revoke\s | comment\s+on\s | (un)?listen\s+\S | notify\s
      | set\s+local\s | show\s+\w+\s*$ | call\s+\w+\.
    )""",
    re.IGNORECASE | re.VERBOSE | re.DOTALL,
)


def sql_text(path: Path) -> list[str]:
    """The string literals of `path` that are SQL statements (docstrings aside)."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    return [
        f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value[:60]!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and SQL.match(node.value)
    ]


def outside_the_gateway() -> list[Path]:
    return sorted(
        path
        for path in PACKAGE.rglob("*.py")
        if not path.is_relative_to(GATEWAY) and not path.is_relative_to(ENGINE_SQL)
    )


def test_no_module_outside_the_gateway_holds_sql_text() -> None:
    found = [line for path in outside_the_gateway() for line in sql_text(path)]
    assert found == []


def test_the_check_sees_the_statements_of_the_gateway() -> None:
    # So that the test above can fail: every kind of statement the gateway holds is recognised.
    for module in STATEMENT_MODULES:
        named = [n for n in names(module) if n.isupper()]
        assert named, module.__name__
        assert [n for n in named if not SQL.match(getattr(module, n))] == [], module.__name__
    assert SQL.match("select pgflow.resume_step(%s, %s)")
    assert SQL.match("show server_version")
    assert SQL.match("select 1")
    assert SQL.match("with recursive tree (run_id, depth) as (select 1) select * from tree")
    assert not SQL.match("show a run, its steps and their last errors")
    assert not SQL.match("create a project: a flow, typed handlers, a test")


def names(module: ModuleType) -> list[str]:
    """The statements `module` defines: its upper-case strings and its own functions."""
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (
            (name.isupper() and isinstance(value, str))
            or (inspect.isfunction(value) and value.__module__ == module.__name__)
        )
    ]


@pytest.mark.parametrize("module", STATEMENT_MODULES, ids=lambda m: m.__name__.split(".")[-1])
def test_every_statement_is_sent_by_some_part(module: ModuleType) -> None:
    prefix = module.__name__.split(".")[-1]
    sources = "".join(path.read_text() for path in outside_the_gateway())
    sources += "".join((GATEWAY / name).read_text() for name in ("roles.py", "support.py"))
    assert [n for n in names(module) if f"{prefix}.{n}" not in sources] == []


def test_no_statement_name_is_defined_twice() -> None:
    defined: dict[str, list[str]] = {}
    for module in STATEMENT_MODULES:
        for name in names(module):
            defined.setdefault(name, []).append(module.__name__)
    assert {n: m for n, m in defined.items() if len(m) > 1} == {}


def test_shared_statements_are_shared() -> None:
    parts: dict[str, str] = {}
    for path in outside_the_gateway():
        part = path.relative_to(PACKAGE).parts[0]
        parts.setdefault(part, "")
        parts[part] += path.read_text()
    for name in [n for n in names(statements) if n.isupper()]:
        users = [part for part, text in parts.items() if f"statements.{name}" in text]
        # "worker_statements.X" also contains "statements.X": look for the bare module name.
        users = [
            part for part in users if re.search(rf"(?<![a-z_])statements\.{name}\b", parts[part])
        ]
        assert len(users) >= 2, f"{name} is sent only by {users}"


#: The operator's actions: one implementation (`runtime/client/operations`) that the Client, the
#: CLI and the dashboard all perform.
ACTIONS = [
    "CANCEL_RUN",
    "RETRY_RUN",
    "SEND_SIGNAL",
    "PAUSE_STEP",
    "RESUME_STEP",
    "SET_STEP_LIMITS",
    "PAUSE_SCHEDULE",
    "RESUME_SCHEDULE",
    "SET_ACTION_LABEL",
]


def test_each_operator_action_is_written_once() -> None:
    operations = PACKAGE / "runtime" / "client" / "operations.py"
    senders = {
        name: [
            str(path.relative_to(PACKAGE))
            for path in outside_the_gateway()
            if re.search(rf"\bclient_statements\.{name}\b", path.read_text())
        ]
        for name in ACTIONS
    }
    assert senders == {name: [str(operations.relative_to(PACKAGE))] for name in ACTIONS}
    for caller in ("cli/connecting.py", "dashboard/actions.py"):
        assert "operations.perform" in (PACKAGE / caller).read_text(), caller
    for caller in ("runtime/client/client.py", "runtime/client/async_client.py"):
        assert "operations.as_call" in (PACKAGE / caller).read_text(), caller

"""Every door checks a run input the same way: the typed Client (before it writes anything) and
`pgflow-gen start` (against the schema the generated migration stored with the flow). One table
of inputs, both doors, the same verdicts and the same first problem; a refused input starts no
run."""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import psycopg
import pytest

from pgflow_gen import cli
from pgflow_gen.codegen import build
from pgflow_gen.runtime import Client, InvalidRunInputError
from pgflow_gen.runtime.client import validate_input

SPEC = """\
slug: doorFlow
input:
  type: object
  properties:
    name: {type: string}
    age: {type: integer}
    score: {type: number}
    tags: {type: array, items: {type: string}}
    address:
      type: object
      properties: {city: {type: string}}
      required: [city]
    kind: {enum: [a, b]}
    note: {type: [string, "null"]}
  required: [name]
steps:
  - slug: one
    handler: doors_app.handlers:one
"""

#: (input, None when valid, else the first problem both doors name)
CASES: list[tuple[Any, str | None]] = [
    ({"name": "Ada"}, None),
    ({"name": "Ada", "age": 36, "score": 1, "tags": [], "kind": "b", "note": None}, None),
    ({"name": "Ada", "address": {"city": "London"}, "unknown": 1}, None),
    ({}, "$.name: missing (required)"),
    ({"name": 3}, "$.name: expected string, got integer"),
    ({"name": None}, "$.name: expected string, got null"),
    ([1, 2], "$: expected object, got array"),
    ("Ada", "$: expected object, got string"),
    (None, "$: expected object, got null"),
    ({"name": "Ada", "age": "36"}, "$.age: expected integer, got string"),
    ({"name": "Ada", "age": True}, "$.age: expected integer, got boolean"),
    ({"name": "Ada", "age": 1.5}, "$.age: expected integer, got number"),
    ({"name": "Ada", "age": 1.0}, "$.age: expected integer, got number"),
    ({"name": "Ada", "score": 2}, None),
    ({"name": "Ada", "tags": ["x", 1]}, "$.tags[1]: expected string, got integer"),
    ({"name": "Ada", "address": {}}, "$.address.city: missing (required)"),
    ({"name": "Ada", "kind": "c"}, '$.kind: must be one of "a", "b", got a different string'),
    ({"name": "Ada", "note": 1}, "$.note: expected string or null, got integer"),
]


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModuleType, str]]:
    """The generated flow module (imported) and its migration, built from SPEC."""
    root = tmp_path_factory.mktemp("doors")
    (root / "flows").mkdir()
    (root / "flows" / "door.yaml").write_text(SPEC)
    files = build.generate([root / "flows" / "door.yaml"], package="doors_app.pgflow", project=root)
    out = root / "doors_app" / "pgflow"
    for relative, text in files.items():
        (out / relative).parent.mkdir(parents=True, exist_ok=True)
        (out / relative).write_text(text)
    (root / "doors_app" / "__init__.py").write_text("")
    (root / "doors_app" / "handlers.py").write_text(
        textwrap.dedent("""\
        def one(flow_input, ctx, /):
            return None
        """)
    )
    sys.path.insert(0, str(root))
    try:
        module = importlib.import_module("doors_app.pgflow.door_flow")
        yield module, files["migrations/doorFlow.sql"]
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n.split(".")[0] == "doors_app"]:
            del sys.modules[name]


def client_verdict(module: ModuleType, value: Any) -> str | None:
    try:
        validate_input(module.FLOW, value)
    except InvalidRunInputError as exc:
        return exc.message
    return None


@pytest.mark.parametrize(("value", "problem"), CASES, ids=[json.dumps(c[0]) for c in CASES])
def test_the_client_and_the_cli_agree_on_every_input(
    generated: tuple[ModuleType, str],
    conn: psycopg.Connection[Any],
    db_url: str,
    capsys: pytest.CaptureFixture[str],
    value: Any,
    problem: str | None,
) -> None:
    module, migration = generated
    conn.execute(migration)  # the generated migration stores the schema with the flow
    expected = None if problem is None else f'Invalid input for flow "doorFlow": {problem}.'

    assert client_verdict(module, value) == expected

    code = cli.main(["start", "doorFlow", "--input", json.dumps(value), "--database-url", db_url])
    captured = capsys.readouterr()
    runs = conn.execute("select count(*) from pgflow.runs").fetchone()
    if expected is None:
        assert code == 0, captured.err
        assert captured.out.startswith("started run ")
        assert runs == (1,)
    else:
        assert code == 2
        assert captured.err.splitlines()[0] == f"error: {expected}"
        assert "HINT: The input must match the flow's input schema" in captured.err
        assert runs == (0,)  # nothing was written


def test_a_worker_compiling_the_flow_stores_the_same_schema_as_the_migration(
    generated: tuple[ModuleType, str], conn: psycopg.Connection[Any], db_url: str
) -> None:
    module, migration = generated
    conn.execute(
        "select pgflow.ensure_flow_compiled(%s, %s::jsonb)", ("doorFlow", module.FLOW.shape_json())
    )
    by_worker = conn.execute("select input_schema from pgflow.flows").fetchone()
    conn.execute("select pgflow.delete_flow_and_data('doorFlow')")
    conn.execute(migration)
    by_migration = conn.execute("select input_schema from pgflow.flows").fetchone()
    assert by_worker == by_migration
    assert by_worker is not None
    assert by_worker[0]["required"] == ["name"]


def test_the_client_refuses_before_writing_anything(
    generated: tuple[ModuleType, str], conn: psycopg.Connection[Any], db_url: str
) -> None:
    module, migration = generated
    conn.execute(migration)
    with pytest.raises(InvalidRunInputError, match=r"\$\.name: missing \(required\)"):
        Client(db_url).start_flow(module.FLOW, {})
    assert conn.execute("select count(*) from pgflow.runs").fetchone() == (0,)


def test_a_flow_compiled_without_a_schema_is_not_checked_by_the_cli(
    conn: psycopg.Connection[Any], db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # As a worker older than engine 0006 compiles it: the engine's own checks still apply.
    conn.execute(
        "select pgflow.ensure_flow_compiled('oldFlow', %s::jsonb)",
        ('{"steps": [{"slug": "one"}]}',),
    )
    code = cli.main(["start", "oldFlow", "--input", "[1, 2]", "--database-url", db_url])
    assert code == 0, capsys.readouterr().err

"""Table triggers from the spec to the database and back through the CLI (engine 0032):
`pgflow-gen build` writes them into the flow's migration, `pgflow-gen db apply` installs them or
says, without a traceback, which trigger cannot work; removing them from the spec removes them
with the next apply; `pgflow-gen flows` lists them and `pgflow-gen flows --skips` the starts
they skipped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgflow_gen import cli
from tests.e2e.harness import run_cli

CASE = Path(__file__).resolve().parents[1] / "golden" / "cases" / "table_triggers"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The golden case's spec in flows/, built into app/pgflow."""
    (tmp_path / "flows").mkdir()
    shutil.copy(CASE / "flow.yaml", tmp_path / "flows" / "order_paid.yaml")
    (tmp_path / "app").mkdir()
    monkeypatch.chdir(tmp_path)
    assert cli.main(["build", "flows", "--out", "app/pgflow"]) == cli.EXIT_OK
    return tmp_path


def apply(capsys: pytest.CaptureFixture[str], db_url: str) -> tuple[int, str, str]:
    capsys.readouterr()
    return run_cli(capsys, db_url, "db", "apply", "app/pgflow")


def test_db_apply_installs_the_triggers_and_a_spec_without_them_removes_them(
    project: Path, db_url: str, conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    migration = Path("app/pgflow/migrations/orderPaid.sql")
    code, out, err = apply(capsys, db_url)
    assert code == cli.EXIT_FAILURE
    assert out == ""
    assert err.splitlines() == [
        'error: orderPaid.sql failed and changed nothing: Flow "orderPaid" trigger "paid": table'
        " public.orders does not exist.",
        "HINT: Create the table before applying the flow's migration, or fix `table:` in the"
        " spec (schema.table; a view cannot have one).",
    ]
    assert conn.execute("select count(*) from pgflow.flows").fetchone() == (0,)

    conn.execute((CASE / "setup.sql").read_bytes())
    assert apply(capsys, db_url) == (
        cli.EXIT_OK,
        f"flow orderPaid compiled; triggers created: paid, trigger_2 ({migration})\n",
        "",
    )
    assert apply(capsys, db_url)[1] == f"flow orderPaid verified ({migration})\n"
    conn.execute("insert into public.orders values (1, 'new', 20, 'ada@example.com')")
    conn.execute("update public.orders set status = 'paid'")
    assert conn.execute("select input from pgflow.runs").fetchall() == [
        ({"order_id": 1, "total": 20, "email": "ada@example.com"},)
    ]

    spec = project / "flows" / "order_paid.yaml"
    text = spec.read_text()
    spec.write_text(text[: text.index("triggers:")] + text[text.index("steps:") :])
    assert cli.main(["build", "flows", "--out", "app/pgflow"]) == cli.EXIT_OK
    assert apply(capsys, db_url)[1] == (
        f"flow orderPaid verified; triggers dropped: paid, trigger_2 ({migration})\n"
    )
    assert conn.execute(
        "select count(*) from pg_trigger where tgfoid = 'pgflow._table_trigger'::regproc"
    ).fetchone() == (0,)


def test_flows_lists_the_triggers_and_their_skipped_starts(
    project: Path, db_url: str, conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    conn.execute((CASE / "setup.sql").read_bytes())
    assert apply(capsys, db_url)[0] == cli.EXIT_OK

    code, out, err = run_cli(capsys, db_url, "flows", "--flow", "orderPaid")
    assert (code, err) == (cli.EXIT_OK, "")
    lines = out.splitlines()
    header = lines.index(
        next(line for line in lines if line.startswith("flow ") and "trigger" in line)
    )
    # Columns apart, each row reads: flow, trigger, table, on, when, input, on error.
    assert [" ".join(line.split()) for line in lines[header + 2 :]] == [
        "orderPaid paid public.orders update old.status is distinct from new.status and"
        " new.status = 'paid' and new.total > '0' email=customer_email, order_id=id, total=total"
        " raise",
        "orderPaid trigger_2 shop.imported_orders insert new.refunded_at is null and new.status"
        " in ('paid', 'settled') order_id=id, total=amount skip",
    ]
    code, out, _ = run_cli(capsys, db_url, "flows", "--flow", "orderPaid", "--format", "json")
    [paid, imported] = json.loads(out)["triggers"]
    assert (paid["name"], paid["table"], paid["on"], paid["when"], paid["on_error"]) == (
        "paid", "public.orders", ["update"], {"status": {"changed": True, "eq": "paid"},
                                             "total": {"gt": 0}}, "raise")  # fmt: skip
    assert imported["input"] == {"order_id": "id", "total": "amount"}

    assert run_cli(capsys, db_url, "flows", "--skips") == (
        cli.EXIT_OK,
        "No start was skipped.\n",
        "",
    )
    # A start a skip trigger could not make, as pgflow._table_trigger logs it
    # (tests/sql/table_triggers makes real ones).
    conn.execute(
        "insert into pgflow.trigger_skips (flow_slug, trigger_name, table_name, operation, input,"
        " sqlstate, message) values ('orderPaid', 'trigger_2', 'shop.imported_orders', 'INSERT',"
        " '{\"order_id\": 3}', '22023', %s)",
        ("x" * 100,),
    )
    code, out, _ = run_cli(capsys, db_url, "flows", "--skips")
    assert code == cli.EXIT_OK
    [row] = out.splitlines()[2:]
    assert row.split()[2:] == [
        "orderPaid", "trigger_2", "shop.imported_orders", "insert", '{"order_id":3}', "22023",
        "x" * 77 + "...",
    ]  # fmt: skip
    code, out, _ = run_cli(capsys, db_url, "flows", "--skips", "--format", "json")
    [skip] = json.loads(out)["skips"]
    assert (skip["input"], skip["message"]) == ({"order_id": 3}, "x" * 100)

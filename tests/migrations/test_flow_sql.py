"""Generated flow migrations delivered to a database: `pgflow-gen db apply` runs them (idempotent,
one transaction each, a line per flow), `pgflow-gen db export` writes versioned files for
Flyway, dbmate, Supabase and Alembic, and the Alembic files run under Alembic itself."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import psycopg
import pytest
from alembic import command
from alembic.config import Config
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.json import Jsonb
from sqlalchemy.engine import URL

from pgflow_gen import cli
from pgflow_gen.cli import flow_sql
from pgflow_gen.errors import UsageError
from tests.e2e.project.app.pgflow import e2e_plain

GENERATED = Path(__file__).resolve().parents[1] / "e2e" / "project" / "app" / "pgflow"


@pytest.fixture
def generated(tmp_path: Path) -> Path:
    """Two flows' generated migrations (from the e2e project), copied so a test may edit them."""
    out = tmp_path / "pgflow"
    (out / "migrations").mkdir(parents=True)
    for flow in ("e2ePlain", "e2eSteps"):
        shutil.copy(GENERATED / "migrations" / f"{flow}.sql", out / "migrations")
    return out


def flows(conn: psycopg.Connection[Any]) -> list[tuple[str, bool]]:
    rows = conn.execute(
        "select flow_slug, input_schema is not null from pgflow.flows order by 1"
    ).fetchall()
    return [(row[0], row[1]) for row in rows]


def test_db_apply_applies_each_flow_once_and_says_what_happened(
    generated: Path, db_url: str, conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    names = [path.stem for path in flow_sql.migration_files(generated)]
    assert cli.main(["db", "apply", str(generated), "--database-url", db_url]) == cli.EXIT_OK
    assert capsys.readouterr().out.splitlines() == [
        f"flow {name} compiled ({generated / 'migrations' / (name + '.sql')})" for name in names
    ]
    assert cli.main(["db", "apply", str(generated / "migrations"), "--database-url", db_url]) == 0
    assert all(" verified (" in line for line in capsys.readouterr().out.splitlines())
    assert flows(conn) == [(name, True) for name in sorted(names)]


def test_db_apply_stops_at_a_flow_that_differs_and_changes_nothing_for_it(
    generated: Path, db_url: str, conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    [first, *_] = flow_sql.migration_files(generated)
    conn.execute(
        'select pgflow.ensure_flow_compiled(%s, \'{"steps": [{"slug": "other"}]}\'::jsonb)',
        (first.stem,),
    )
    assert cli.main(["db", "apply", str(generated), "--database-url", db_url]) == cli.EXIT_FAILURE
    err = capsys.readouterr().err
    assert err.startswith(f"error: {first.name} failed and changed nothing: Flow ")
    assert flows(conn) == [(first.stem, False)]  # the rest was not applied either


def test_a_generated_migration_adopts_its_spec_again_over_a_newer_workers(
    generated: Path, db_url: str, conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    # A reverted spec: its migration is applied again after a newer worker's description was
    # adopted; an older worker alone would be kept out (tests/sql/ensure_flow_compiled).
    migration = generated / "migrations" / "e2ePlain.sql"
    apply = ["db", "apply", str(generated), "--database-url", db_url]
    assert cli.main(apply) == cli.EXIT_OK
    ensure = "select pgflow.ensure_flow_compiled('e2ePlain', %s)"
    worker_shape = e2e_plain.FLOW.shape()
    # The generated module (which workers compile) describes the flow as its migration does.
    assert conn.execute(ensure, (Jsonb(worker_shape),)).fetchone() == (
        {"status": "verified", "mismatchKind": None, "differences": []},
    )
    newer = {**worker_shape, "options": {**worker_shape["options"], "maxAttempts": 9}}
    conn.execute(ensure, (Jsonb(newer),))
    [(kept,)] = conn.execute(ensure, (Jsonb(worker_shape),)).fetchall()
    assert kept["descriptionKept"] is True
    capsys.readouterr()
    assert cli.main(apply) == cli.EXIT_OK
    assert (
        f"flow e2ePlain verified; options updated: flow maxAttempts 9 ->"
        f" {worker_shape['options']['maxAttempts']} ({migration})"
    ) in capsys.readouterr().out.splitlines()


def test_db_apply_without_migrations_is_a_usage_error(
    tmp_path: Path, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["db", "apply", str(tmp_path), "--database-url", db_url]) == cli.EXIT_USAGE
    assert capsys.readouterr().err.startswith(f"error: No generated flow migrations in {tmp_path}.")


@pytest.mark.parametrize(
    ("style", "names"),
    [
        ("flyway", ["V1__pgflow_{0}.sql", "V2__pgflow_{1}.sql"]),
        ("dbmate", ["00000000000001_pgflow_{0}.sql", "00000000000002_pgflow_{1}.sql"]),
        ("supabase", ["00000000000001_pgflow_{0}.sql", "00000000000002_pgflow_{1}.sql"]),
        ("alembic", ["pgflow_0001_{2}.py", "pgflow_0002_{3}.py"]),
    ],
)
def test_export_writes_a_new_file_only_when_a_flows_sql_changes(
    generated: Path, tmp_path: Path, style: flow_sql.Style, names: list[str]
) -> None:
    files = flow_sql.migration_files(generated)
    stems = [path.stem for path in files]
    target = tmp_path / "target"
    first = flow_sql.export(files, target, style)
    lower = [stem.lower() for stem in stems]
    assert [item.path.name for item in first] == [name.format(*lower, *stems) for name in names]
    assert flow_sql.export(files, target, style) == []  # unchanged: nothing new
    files[1].write_text(files[1].read_text() + "-- changed\n")
    [again] = flow_sql.export(files, target, style)
    assert again.flow == stems[1]
    assert again.path.name.startswith(("V3__", "00000000000003_", "pgflow_0003_"))
    assert sorted(p.name for p in target.iterdir()) == sorted(
        [*(item.path.name for item in first), again.path.name, flow_sql.LEDGER]
    )


def test_export_keeps_one_style_per_folder(generated: Path, tmp_path: Path) -> None:
    files = flow_sql.migration_files(generated)
    flow_sql.export(files, tmp_path / "t", "flyway")
    with pytest.raises(UsageError, match="holds flyway exports"):
        flow_sql.export(files, tmp_path / "t", "dbmate")


def test_alembic_runs_the_exported_revisions_against_the_real_engine(
    generated: Path, tmp_path: Path, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    # `alembic init alembic`, as a user does; then a config without the ini file, so that env.py
    # leaves logging alone (its fileConfig would disable the loggers of the other tests).
    command.init(Config(str(tmp_path / "alembic.ini")), str(tmp_path / "alembic"))
    config = Config()
    config.set_main_option("script_location", str(tmp_path / "alembic"))
    params = conninfo_to_dict(db_url)
    url = URL.create(
        "postgresql+psycopg",
        username=str(params.pop("user")),
        database=str(params.pop("dbname")),
        query={key: str(value) for key, value in params.items()},
    ).render_as_string(hide_password=False)
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))  # ini-style interpolation
    versions = tmp_path / "alembic" / "versions"
    files = flow_sql.migration_files(generated)
    flow_sql.export(files, versions, "alembic")

    command.upgrade(config, "heads")
    assert flows(conn) == [(path.stem, True) for path in sorted(files, key=lambda p: p.stem)]

    # A later build changes one flow's SQL (its input schema): one new revision on its branch.
    changed = files[0].read_text().replace('"required"', '"description": "v2",\n    "required"', 1)
    files[0].write_text(changed)
    [new] = flow_sql.export(files, versions, "alembic")
    command.upgrade(config, "heads")
    schema = conn.execute(
        "select input_schema from pgflow.flows where flow_slug = %s", (files[0].stem,)
    ).fetchone()
    assert schema is not None
    assert schema[0]["description"] == "v2"
    assert new.path.stem in {
        row[0] for row in conn.execute("select version_num from alembic_version").fetchall()
    }

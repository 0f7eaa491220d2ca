from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgflow_gen.runtime import errors, migrations
from pgflow_gen.runtime.sql import catalog, shipped, writer
from pgflow_gen.testing.clones import create_database, drop_database

RELEASED = shipped.released()


def connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


def test_source_files_and_migrations_build_identical_catalogs(
    empty_db_url: str, db_url: str
) -> None:
    with connect(empty_db_url) as conn:
        migrations.ensure_pgmq(conn)
        for _name, text in shipped.source_files():
            conn.execute(text)
    from_source = catalog.snapshot(empty_db_url)
    from_migrations = catalog.snapshot(db_url)
    for kind in catalog.QUERIES:
        assert from_source[kind] == from_migrations[kind], kind
    assert len(from_source["functions"]) > 20


def test_released_migrations_never_change() -> None:
    checksums = {m.version: m.checksum for m in shipped.available()}
    for version, checksum in RELEASED.items():
        assert checksums[version] == checksum, f"migration {version} was edited after release"


def test_every_migration_is_listed_as_released() -> None:
    assert sorted(RELEASED) == [m.version for m in shipped.available()]


def test_migrate_records_each_migration_with_its_checksum(db_url: str) -> None:
    with connect(db_url) as conn:
        recorded = migrations.applied(conn)
    assert recorded == {m.version: m.checksum for m in shipped.available()}


def test_migrate_is_idempotent(db_url: str) -> None:
    with connect(db_url) as conn:
        assert migrations.migrate(conn) == []
        assert migrations.ensure_pgmq(conn) is None


def test_concurrent_migrations_apply_everything_once(empty_db_url: str) -> None:
    barrier = threading.Barrier(4)
    results: list[object] = []

    def run() -> None:
        with connect(empty_db_url) as conn:
            barrier.wait()
            try:
                results.append(len(migrations.migrate(conn)))
            except Exception as exc:  # collected and asserted below
                results.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results, key=str) == [0, 0, 0, len(shipped.available())]
    with connect(empty_db_url) as conn:
        assert migrations.applied(conn).keys() == {m.version for m in shipped.available()}


def test_pgmq_is_installed_as_sql_with_its_version_in_the_schema_comment(
    empty_db_url: str,
) -> None:
    with connect(empty_db_url) as conn:
        version = migrations.ensure_pgmq(conn)
        comment = conn.execute(
            "select obj_description('pgmq'::regnamespace, 'pg_namespace')"
        ).fetchone()
    assert version == migrations.pgmq_sql()[1]
    assert comment == (f"PGMQ {version}, installed as SQL by pgflow-gen",)


def test_an_existing_pgmq_is_used_as_it_is(empty_db_url: str) -> None:
    with connect(empty_db_url) as conn:
        conn.execute("create schema pgmq")
        assert migrations.ensure_pgmq(conn) is None
        assert conn.execute(
            "select count(*) from pg_proc where pronamespace = 'pgmq'::regnamespace"
        ).fetchone() == (0,)


def test_an_edited_applied_migration_is_an_error(db_url: str) -> None:
    with connect(db_url) as conn:
        conn.execute(
            "update pgflow.schema_migrations set checksum = 'edited' where version = '0001'"
        )
        with pytest.raises(errors.MigrationError, match="was edited after it was applied"):
            migrations.migrate(conn)


def test_a_migration_unknown_to_this_version_is_an_error(db_url: str) -> None:
    with connect(db_url) as conn:
        conn.execute(
            "insert into pgflow.schema_migrations (version, name, checksum)"
            " values ('9999', 'future', 'x')"
        )
        with pytest.raises(errors.MigrationError, match="unknown to this pgflow-gen"):
            migrations.migrate(conn)


def test_target_stops_at_the_given_migration(empty_db_url: str) -> None:
    with connect(empty_db_url) as conn:
        applied = migrations.migrate(conn, target="0001")
    assert [m.version for m in applied] == ["0001"]


def test_an_unknown_target_is_an_error_and_applies_nothing(empty_db_url: str) -> None:
    with connect(empty_db_url) as conn:
        with pytest.raises(errors.MigrationError, match="Unknown migration target"):
            migrations.migrate(conn, target="0777")
        assert migrations.applied(conn) == {}


def test_a_failing_migration_is_rolled_back_whole(
    empty_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    every = shipped.available()
    next_version = f"{len(every) + 1:04d}"
    broken = shipped.Migration(
        next_version, "broken", "create table pgflow.half (x int);\nselect 1/0;"
    )
    monkeypatch.setattr(shipped, "available", lambda: (*every, broken))
    with connect(empty_db_url) as conn:
        with pytest.raises(errors.MigrationError, match=f"{next_version}_broken failed") as raised:
            migrations.migrate(conn)
        assert raised.value.detail == "division by zero"
        assert conn.execute("select to_regclass('pgflow.half')").fetchone() == (None,)
        assert migrations.applied(conn).keys() == {m.version for m in every}


def test_migrate_needs_an_autocommit_connection(empty_db_url: str) -> None:
    with (
        psycopg.connect(empty_db_url) as conn,
        pytest.raises(errors.MigrationError, match="autocommit"),
    ):
        migrations.migrate(conn)


def test_the_printed_engine_script_agrees_with_migrate(admin_url: str, empty_db_url: str) -> None:
    with connect(empty_db_url) as conn:
        migrations.ensure_pgmq(conn)
        conn.execute(migrations.engine_script())
        assert migrations.migrate(conn) == []
    other = create_database(admin_url, "pgflow_script_vs_migrate")
    try:
        with connect(other) as conn:
            migrations.migrate(conn)
        assert catalog.snapshot(empty_db_url) == catalog.snapshot(other)
    finally:
        drop_database(admin_url, "pgflow_script_vs_migrate")


def test_the_newest_migration_is_what_the_writer_writes_from_the_source(admin_url: str) -> None:
    *before, newest = shipped.available()
    file_name = f"{newest.version}_{newest.name}.sql"
    written = writer.draft_from(admin_url, file_name, writer.Parts.of(newest.sql), before)
    assert written.text == newest.sql, (
        "The source changed since the newest migration was written: run"
        f" `make migration NAME={newest.name}` (or a new NAME once it is released)."
    )


@contextlib.contextmanager
def databases_for(admin_url: str) -> Iterator[tuple[str, str]]:
    """Two empty databases of this test's own."""
    names = [f"pgflow_writer_test_{uuid.uuid4().hex[:8]}" for _ in range(2)]
    urls = [create_database(admin_url, name) for name in names]
    try:
        yield urls[0], urls[1]
    finally:
        for name in names:
            drop_database(admin_url, name)


def apply_and_compare(admin_url: str, before: list[shipped.Migration], text: str) -> None:
    """Apply `before`, then a written migration: the catalog must be the source's."""
    with (
        databases_for(admin_url) as (built, source),
        psycopg.connect(built, autocommit=True) as conn,
    ):
        migrations.ensure_pgmq(conn)
        for migration in before:
            conn.execute(migrations.trusted(migration.sql))
        conn.execute(migrations.trusted(text))
        with psycopg.connect(source, autocommit=True) as other:
            migrations.ensure_pgmq(other)
            for _name, sql_text in shipped.source_files():
                other.execute(migrations.trusted(sql_text))
        assert catalog.snapshot(built) == catalog.snapshot(source)


def test_the_writer_replaces_changed_triggers_and_functions_whose_defaults_changed(
    admin_url: str,
) -> None:
    before = list(shipped.available())
    # As if the engine had a trigger the source changed and a function with another default.
    changed = (
        "drop trigger step_tasks_keyed_status on pgflow.step_tasks;"
        " drop function pgflow.calculate_retry_delay(numeric, int);"
        " create function pgflow.calculate_retry_delay(base_delay numeric, attempts_count int"
        " default 1) returns int language sql as $$ select 1 $$;"
    )
    written = writer.draft_from(admin_url, "9999_x.sql", writer.Parts("-- x", changed), before)
    assert [c.name for c in written.changes] == [
        "pgflow.calculate_retry_delay(numeric,integer)",
        "step_tasks_keyed_status on pgflow.step_tasks",
    ]
    delay, trigger = (c.statement for c in written.changes)
    assert delay.startswith("drop function pgflow.calculate_retry_delay(numeric,integer);\n")
    assert trigger.startswith("create trigger step_tasks_keyed_status")
    assert "$$" not in trigger
    apply_and_compare(admin_url, before, written.text)


def test_a_released_migration_is_never_written_again_and_markers_must_be_in_order() -> None:
    newest = shipped.available()[-1]
    with pytest.raises(errors.MigrationError, match="is released: it never changes"):
        writer.target(newest.name)
    end_first = f"{writer.END_HAND_WRITTEN}\n{writer.BEGIN_HAND_WRITTEN}\n{writer.GENERATED}"
    with pytest.raises(errors.MigrationError, match="markers moved"):
        writer.Parts.of(end_first)


def test_the_writer_says_when_tables_differ_and_writes_what_changed(admin_url: str) -> None:
    every = shipped.available()
    before_0021 = [m for m in every if m.version < "0021"]
    # From 0020 with the tables of every later migration (their hand-written sections), the
    # source's functions differ: at least the five 0021 changed or added (and any a later
    # migration changed), in source order.
    tables = "\n".join(writer.Parts.of(m.sql).hand_written for m in every if m.version >= "0021")
    again = writer.Parts("-- again", tables)
    written = writer.draft_from(admin_url, "0021_again.sql", again, before_0021)
    names = [c.name.split("(")[0] for c in written.changes]
    assert {
        "pgflow._claim_messages",
        "pgflow.start_scheduled_runs",
        "pgflow._engine_settings",
        "pgflow._cron_values",
        "pgflow._cron_names",
    } <= set(names)
    files = [c.source_file or "" for c in written.changes]
    assert files == sorted(files)
    assert "create function pgflow._cron_names" in written.text
    assert "create or replace function pgflow._claim_messages" in written.text
    # From 0019, step_tasks lacks a column 0020 added by hand: the writer will not guess it.
    before_0020 = [m for m in every if m.version < "0020"]
    with pytest.raises(errors.MigrationError) as raised:
        writer.draft_from(admin_url, "0020_again.sql", writer.Parts("-- again"), before_0020)
    assert "hand-written section" in str(raised.value)
    assert "step_tasks attempts_before_retry integer" in (raised.value.detail or "")


def test_the_writer_command_writes_nothing_for_a_wrong_call(
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = sorted(shipped.folder().iterdir())
    assert writer.main([]) == 2
    assert capsys.readouterr().err == "usage: make migration NAME=what_it_changes\n"
    assert writer.main(["Bad-Name"]) == 1
    assert capsys.readouterr().err == (
        "error: Invalid migration name 'Bad-Name'.\nHINT: Use lower-case letters, digits and _.\n"
    )
    assert writer.main(["nothing_new"]) == 1  # the source is what the migrations build
    err = capsys.readouterr().err
    assert err.startswith("error: Nothing in the source differs from the migrations")
    assert "Traceback" not in err
    assert sorted(shipped.folder().iterdir()) == before


def test_a_table_change_waits_as_a_draft_for_its_hand_written_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The source gains a column; the migrations folder is this test's copy.
    for migration in shipped.available():
        (tmp_path / f"{migration.version}_{migration.name}.sql").write_text(migration.sql)
    sources = [
        (name, text.replace("  input_schema jsonb,\n", "  input_schema jsonb,\n  note text,\n"))
        for name, text in shipped.source_files()
    ]
    assert sources != list(shipped.source_files())
    monkeypatch.setattr(shipped, "folder", lambda: tmp_path)
    monkeypatch.setattr(shipped, "source_files", lambda: tuple(sources))
    monkeypatch.setattr(shipped, "released", lambda: {})
    version = f"{int(shipped.available()[-1].version) + 1:04d}"
    draft_file = tmp_path / f"{version}_flow_notes.sql.draft"

    assert writer.main(["flow_notes"]) == 1
    out, err = capsys.readouterr()
    assert err.startswith("error: The source's columns differ from the migrations'")
    assert "flows note text" in err
    assert out == f"wrote {draft_file}: write its hand-written section, then run this again\n"
    assert not (tmp_path / f"{version}_flow_notes.sql").exists()  # nothing a migrate would apply

    draft_text = draft_file.read_text()
    draft_file.write_text(
        draft_text.replace(
            writer.END_HAND_WRITTEN,
            f"alter table pgflow.flows add column note text;\n{writer.END_HAND_WRITTEN}",
        )
    )
    assert writer.main(["flow_notes"]) == 0
    written = (tmp_path / f"{version}_flow_notes.sql").read_text()
    assert "alter table pgflow.flows add column note text;" in written
    assert not draft_file.exists()
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path / f'{version}_flow_notes.sql'}")

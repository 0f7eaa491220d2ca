"""Writes the next engine migration from what changed in the engine source.

    make migration NAME=cron_slots    # = python -m pgflow_gen.runtime.sql.writer cron_slots

The source files (`source/`, one object per file) are the truth; a migration is derived from
them. The writer builds two databases on a throwaway embedded server: one from the migrations
before the one it writes, followed by that migration's hand-written section (table and data
changes, which no tool can derive), and one from the source files. Then it writes every function
whose definition differs, in source order: a new one with `create function`, a changed one with
`create or replace function` (after a `drop function` when its result or argument names changed,
which `create or replace` cannot do), and a `drop function` for one the source no longer has;
last, the revoke that keeps PUBLIC from executing any of them. Columns, constraints, indexes or
types that still differ after the hand-written section are an error naming them.

NAME picks the file: the newest migration when it has that name (it is written again, keeping
its header and hand-written section: released migrations never change, a test checks their
checksums), else a new one numbered after it. A test writes the newest migration again and
compares it with the committed one, so the source and the newest migration cannot drift apart.
"""

from __future__ import annotations

import re
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pgflow_gen.runtime import embedded, errors, migrations
from pgflow_gen.runtime.sql import catalog

BEGIN_HAND_WRITTEN = "-- BEGIN HAND-WRITTEN: tables and data, applied before the functions below."
END_HAND_WRITTEN = "-- END HAND-WRITTEN"
GENERATED = (
    "-- Written by `make migration` from pgflow_gen/runtime/sql/source/: edit the source, then\n"
    "-- write the migration again; only the header and the hand-written section above are kept."
)
REVOKE = (
    "-- No engine function runs for PUBLIC (engine 0019), those above included.\n"
    "revoke execute on all functions in schema pgflow from public;\n"
)
_NAME = re.compile(r"^[a-z0-9_]+$")
#: A function as `regprocedure`, its full definition, and its result and argument names.
_FUNCTIONS = """
    select p.oid::regprocedure::text, pg_get_functiondef(p.oid),
      pg_get_function_result(p.oid), coalesce(p.proargnames::text, '')
    from pg_proc as p where p.pronamespace = 'pgflow'::regnamespace"""


class TableChangesMissing(errors.MigrationError):
    """The source's tables (columns, constraints, indexes, types) differ from the migrations'
    after the hand-written section: only a person can write that change."""


@dataclass(frozen=True)
class Parts:
    """What a migration keeps when it is written again: its header comment (what it changes and
    why) and its hand-written section (empty: none)."""

    header: str
    hand_written: str = ""

    @classmethod
    def new(cls, version: str, name: str) -> Parts:
        title = name.replace("_", " ")
        return cls(f"-- Engine migration {version}: {title}.\n-- Say here what it changes and why.")

    @classmethod
    def of(cls, text: str) -> Parts:
        """The parts of a migration this module wrote."""
        if BEGIN_HAND_WRITTEN not in text or GENERATED not in text:
            raise errors.MigrationError(
                "This migration was not written by `make migration`.",
                hint="Give the new migration a name of its own.",
            )
        header, rest = text.split(BEGIN_HAND_WRITTEN, 1)
        hand_written = rest.split(END_HAND_WRITTEN, 1)[0]
        return cls(header.strip(), hand_written.strip())


@dataclass(frozen=True)
class Change:
    """One function statement of a migration, with the source file it comes from."""

    function: str
    statement: str
    source_file: str | None


def render(parts: Parts, changes: Sequence[Change]) -> str:
    """The migration's text."""
    lines = [parts.header, "", BEGIN_HAND_WRITTEN]
    if parts.hand_written:
        lines.append(parts.hand_written)
    lines += [END_HAND_WRITTEN, "", GENERATED, ""]
    for change in changes:
        origin = f"source/{change.source_file}" if change.source_file else "gone from the source"
        lines += [f"-- {change.function.split('(')[0]}: {origin}", change.statement.rstrip(), ""]
    return "\n".join(lines) + REVOKE


def target(name: str) -> tuple[str, Parts, tuple[migrations.Migration, ...]]:
    """(version, parts, the migrations before it) of the migration NAME writes."""
    if not _NAME.match(name):
        raise errors.MigrationError(
            f"Invalid migration name {name!r}.", hint="Use lower-case letters, digits and _."
        )
    shipped = migrations.available()
    newest = shipped[-1]
    if newest.name == name:
        return newest.version, Parts.of(newest.sql), shipped[:-1]
    version = f"{int(newest.version) + 1:04d}"
    return version, Parts.new(version, name), shipped


@dataclass(frozen=True)
class Draft:
    """A migration as written: its file name, text, and function changes."""

    file_name: str
    text: str
    changes: tuple[Change, ...]


def draft(admin_url: str, name: str) -> Draft:
    """The migration NAME, built on the server at `admin_url`."""
    version, parts, before = target(name)
    return draft_from(admin_url, f"{version}_{name}.sql", parts, before)


def draft_from(
    admin_url: str, file_name: str, parts: Parts, before: Sequence[migrations.Migration]
) -> Draft:
    """The migration `file_name` with `parts`, after the migrations `before`."""
    with _database(admin_url) as baseline_url, _database(admin_url) as source_url:
        with psycopg.connect(baseline_url, autocommit=True) as baseline:
            migrations.ensure_pgmq(baseline)
            for migration in before:
                baseline.execute(migrations.trusted(migration.sql))
            if parts.hand_written:
                baseline.execute(migrations.trusted(parts.hand_written))
        with psycopg.connect(source_url, autocommit=True) as source:
            migrations.ensure_pgmq(source)
            files = _apply_source(source)
        _check_tables(baseline_url, source_url)
        with (
            psycopg.connect(baseline_url) as baseline,
            psycopg.connect(source_url) as source,
        ):
            changes = _changes(baseline, source, files)
    return Draft(file_name, render(parts, changes), tuple(changes))


def _apply_source(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """Applies the source files one by one; returns {function: the file that defines it}."""
    defined: dict[str, str] = {}
    for file_name, text in migrations.source_files():
        conn.execute(migrations.trusted(text))
        for (function,) in conn.execute(
            "select p.oid::regprocedure::text from pg_proc as p"
            " where p.pronamespace = 'pgflow'::regnamespace"
        ):
            defined.setdefault(function, file_name)
    return defined


def _check_tables(baseline_url: str, source_url: str) -> None:
    """Everything but the functions must already agree (the hand-written section's job)."""
    before, after = catalog.snapshot(baseline_url), catalog.snapshot(source_url)
    differing = [
        kind for kind in catalog.QUERIES if kind != "functions" and before[kind] != after[kind]
    ]
    if differing:
        missing = sorted(
            {row[:3] for kind in differing for row in set(after[kind]) ^ set(before[kind])},
            key=str,
        )
        raise TableChangesMissing(
            f"The source's {', '.join(differing)} differ from the migrations' and the"
            " hand-written section does not change them.",
            detail="\n".join(" ".join(map(str, row)) for row in missing[:20]),
            hint=f"Write the table and data changes between {BEGIN_HAND_WRITTEN!r} and"
            f" {END_HAND_WRITTEN!r}, then write the migration again.",
        )


def _changes(
    baseline: psycopg.Connection[Any], source: psycopg.Connection[Any], files: dict[str, str]
) -> list[Change]:
    old = {row[0]: row[1:] for row in baseline.execute(_FUNCTIONS)}
    new = {row[0]: row[1:] for row in source.execute(_FUNCTIONS)}
    texts = dict(migrations.source_files())
    changes = [
        Change(function, f"drop function pgflow.{_bare(function)};", None)
        for function in sorted(set(old) - set(new))
    ]
    order = {file_name: index for index, file_name in enumerate(texts)}
    for function in sorted(new, key=lambda f: (order[files[f]], f)):
        if old.get(function, (None,))[0] == new[function][0]:
            continue
        statement = _create_statement(texts[files[function]])
        if function in old:
            statement = statement.replace("create function", "create or replace function", 1)
            if old[function][1:] != new[function][1:]:
                statement = f"drop function pgflow.{_bare(function)};\n{statement}"
        changes.append(Change(function, statement, files[function]))
    return changes


def _bare(function: str) -> str:
    return function.removeprefix("pgflow.")


def _create_statement(text: str) -> str:
    """A source file's statement without its leading comment."""
    start = text.index("create ")
    return text[start:].strip() + "\n"


@contextmanager
def _database(admin_url: str) -> Iterator[str]:
    name = f"pgflow_writer_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    try:
        yield psycopg.conninfo.make_conninfo(admin_url, dbname=name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("drop database {} with (force)").format(sql.Identifier(name)))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: make migration NAME=what_it_changes", file=sys.stderr)
        return 2
    folder = migrations.folder()
    base = Path(tempfile.mkdtemp(prefix="pgflow-writer-"))
    server = embedded.EmbeddedServer(base, embedded.default_bin_dir(), fast=True, local=False)
    try:
        written = draft(server.ensure_started(), args[0])
    except errors.PgflowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if isinstance(exc, TableChangesMissing):
            version, parts, _before = target(args[0])
            skeleton = folder / f"{version}_{args[0]}.sql"
            if not skeleton.exists():
                skeleton.write_text(render(parts, []), encoding="utf-8")
                print(f"wrote {skeleton} without functions: write its hand-written section first")
        return 1
    finally:
        server.destroy()
    path = folder / written.file_name
    existed = path.exists()
    if not existed and not written.changes:
        print(
            "error: Nothing in the source differs from the migrations: no migration to write.\n"
            "HINT: Edit pgflow_gen/runtime/sql/source/ first (a table change: write it in the"
            " hand-written section of a migration this wrote).",
            file=sys.stderr,
        )
        return 1
    path.write_text(written.text, encoding="utf-8")
    print(f"{'rewrote' if existed else 'wrote'} {path}: {len(written.changes)} function(s)")
    for change in written.changes:
        print(f"  {change.function}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Writes the next engine migration from what changed in the engine source.

    make migration NAME=cron_slots    # = python -m pgflow_gen.runtime.sql.writer cron_slots

The source files (`source/`, one object per file) are the truth; a migration is derived from
them. The writer builds two databases on a throwaway embedded server: one from the migrations
before the one it writes, followed by that migration's hand-written section (table and data
changes, which no tool can derive), and one from the source files. Then it writes every function
and trigger whose definition differs, in source order: a new function with `create function`, a
changed one with `create or replace function` (after a `drop function` when its result, its
arguments or their defaults changed, which `create or replace` cannot do), a changed trigger
dropped and created again, and a drop for what the source no longer has; last, the revoke that
keeps PUBLIC from executing any function. Columns, constraints, indexes or types that still
differ after the hand-written section are an error naming them (TableChangesMissing).

NAME picks the file. The newest migration with that name is written again, keeping its header
and hand-written section, unless it is released (`released.json`: released migrations never
change). Any other NAME starts the next migration; while its table changes are missing it waits
as `NNNN_NAME.sql.draft`, which no migration run applies, for its hand-written section. A test
writes the newest migration again and compares it with the committed one, so the source and the
newest migration cannot drift apart.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, LiteralString

import psycopg
from psycopg import sql

from pgflow_gen.runtime import embedded, errors, migrations
from pgflow_gen.runtime.sql import catalog, shipped
from pgflow_gen.words import counted

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
#: A new migration's file while it waits for its hand-written section (never applied).
DRAFT_SUFFIX = ".draft"
_NAME = re.compile(r"^[a-z0-9_]+$")
#: () -> each function as `regprocedure`, its full definition, and what `create or replace`
#: cannot change: its result, argument names, and arguments with their defaults.
_FUNCTIONS: Final[LiteralString] = (
    "select p.oid::regprocedure::text, pg_get_functiondef(p.oid),"
    " pg_get_function_result(p.oid), coalesce(p.proargnames::text, ''),"
    " pg_get_function_arguments(p.oid)"
    " from pg_proc as p where p.pronamespace = 'pgflow'::regnamespace"
)
#: () -> each trigger on the engine's tables, named as `drop trigger` takes it, and its definition.
_TRIGGERS: Final[LiteralString] = (
    "select format('%I on %s', t.tgname, t.tgrelid::regclass), pg_get_triggerdef(t.oid)"
    " from pg_trigger as t join pg_class as c on c.oid = t.tgrelid"
    " where c.relnamespace = 'pgflow'::regnamespace and not t.tgisinternal"
)
_CREATE_FUNCTION = re.compile(r"^create function .*?^\$\$;$", re.MULTILINE | re.DOTALL)
_CREATE_TRIGGER = re.compile(
    r"^create (?:constraint )?trigger (\w+).*?;$", re.MULTILINE | re.DOTALL
)


#: The differing table rows a TableChangesMissing error lists (the rest are counted): enough for
#: every table change since 0019 (64 rows on PostgreSQL 18 at engine 0031, where 40 cut off
#: some of 0020's), so a forgotten hand-written section is named whole.
DETAIL_ROWS = 100


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
        """The parts of a migration this module wrote (its markers in their order)."""
        begin, end, generated = (text.find(m) for m in (BEGIN_HAND_WRITTEN, END_HAND_WRITTEN,
                                                        GENERATED))  # fmt: skip
        if not 0 <= begin < end < generated:
            raise errors.MigrationError(
                "This migration was not written by `make migration` (or its markers moved).",
                detail=f"It needs {BEGIN_HAND_WRITTEN!r}, then {END_HAND_WRITTEN!r}, then the"
                " generated part's first line, in that order.",
                hint="Give the new migration a name of its own.",
            )
        header = text[:begin]
        hand_written = text[begin + len(BEGIN_HAND_WRITTEN) : end]
        return cls(header.strip(), hand_written.strip())


@dataclass(frozen=True)
class Change:
    """One statement of a migration (a function or trigger created, replaced or dropped), with
    the object it changes and the source file it comes from (None: gone from the source)."""

    name: str
    statement: str
    source_file: str | None


@dataclass(frozen=True)
class Draft:
    """A migration as written: its file name, text, and changes."""

    file_name: str
    text: str
    changes: tuple[Change, ...]


def render(parts: Parts, changes: Sequence[Change]) -> str:
    """The migration's text."""
    lines = [parts.header, "", BEGIN_HAND_WRITTEN]
    if parts.hand_written:
        lines.append(parts.hand_written)
    lines += [END_HAND_WRITTEN, "", GENERATED, ""]
    for change in changes:
        origin = f"source/{change.source_file}" if change.source_file else "gone from the source"
        lines += [f"-- {change.name.split('(')[0]}: {origin}", change.statement.rstrip(), ""]
    return "\n".join(lines) + REVOKE


def target(name: str) -> tuple[str, Parts, tuple[shipped.Migration, ...]]:
    """(version, parts, the migrations before it) of the migration NAME writes."""
    if not _NAME.match(name):
        raise errors.MigrationError(
            f"Invalid migration name {name!r}.", hint="Use lower-case letters, digits and _."
        )
    every = shipped.available()
    newest = every[-1]
    if newest.name == name:
        if newest.version in shipped.released():
            raise errors.MigrationError(
                f"Migration {newest.version}_{name} is released: it never changes.",
                hint="Give the change a new NAME: it becomes the next migration.",
            )
        return newest.version, Parts.of(newest.sql), every[:-1]
    version = f"{int(newest.version) + 1:04d}"
    waiting = shipped.folder() / f"{version}_{name}.sql{DRAFT_SUFFIX}"
    if waiting.exists():
        return version, Parts.of(waiting.read_text(encoding="utf-8")), every
    return version, Parts.new(version, name), every


def draft(admin_url: str, name: str) -> Draft:
    """The migration NAME, built on the server at `admin_url`."""
    version, parts, before = target(name)
    return draft_from(admin_url, f"{version}_{name}.sql", parts, before)


def draft_from(
    admin_url: str, file_name: str, parts: Parts, before: Sequence[shipped.Migration]
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
    """Applies the source files one by one; returns {function or trigger: its file}."""
    defined: dict[str, str] = {}
    for file_name, text in shipped.source_files():
        conn.execute(migrations.trusted(text))
        for query in (_FUNCTIONS, _TRIGGERS):
            for row in conn.execute(query):
                defined.setdefault(row[0], file_name)
    return defined


def _check_tables(baseline_url: str, source_url: str) -> None:
    """Everything but the functions and triggers must already agree (the hand-written
    section's job)."""
    before, after = catalog.snapshot(baseline_url), catalog.snapshot(source_url)
    differing = [
        kind
        for kind in catalog.QUERIES
        if kind not in ("functions", "triggers") and before[kind] != after[kind]
    ]
    if differing:
        missing = sorted(
            {row[:3] for kind in differing for row in set(after[kind]) ^ set(before[kind])},
            key=str,
        )
        shown = [" ".join(map(str, row)) for row in missing[:DETAIL_ROWS]]
        if len(missing) > DETAIL_ROWS:
            shown.append(f"... and {len(missing) - DETAIL_ROWS} more")
        raise TableChangesMissing(
            f"The source's {', '.join(differing)} differ from the migrations' and the"
            " hand-written section does not change them.",
            detail="\n".join(shown),
            hint=f"Write the table and data changes between {BEGIN_HAND_WRITTEN!r} and"
            f" {END_HAND_WRITTEN!r}, then write the migration again.",
        )


def _changes(
    baseline: psycopg.Connection[Any], source: psycopg.Connection[Any], files: dict[str, str]
) -> list[Change]:
    texts = dict(shipped.source_files())
    order = {file_name: index for index, file_name in enumerate(texts)}
    old_functions = {row[0]: row[1:] for row in baseline.execute(_FUNCTIONS)}
    new_functions = {row[0]: row[1:] for row in source.execute(_FUNCTIONS)}
    old_triggers = dict(baseline.execute(_TRIGGERS).fetchall())
    new_triggers = dict(source.execute(_TRIGGERS).fetchall())
    # What the source no longer has goes first: triggers, then their functions.
    changes = [
        Change(trigger, f"drop trigger {trigger};", None)
        for trigger in sorted(set(old_triggers) - set(new_triggers))
    ]
    changes += [
        Change(function, f"drop function {function};", None)
        for function in sorted(set(old_functions) - set(new_functions))
    ]
    made: list[tuple[tuple[int, int, str], Change]] = []
    for function, (definition, *fixed) in new_functions.items():
        before = old_functions.get(function)
        if before is not None and before[0] == definition:
            continue
        statement = _statement(_CREATE_FUNCTION, texts[files[function]], function)
        if before is not None:
            statement = statement.replace("create function", "create or replace function", 1)
            if list(before[1:]) != fixed:
                statement = f"drop function {function};\n{statement}"
        made.append(((order[files[function]], 0, function), Change(function, statement,
                                                                   files[function])))  # fmt: skip
    for trigger, definition in new_triggers.items():
        if old_triggers.get(trigger) == definition:
            continue
        statement = _statement(_CREATE_TRIGGER, texts[files[trigger]], trigger)
        if trigger in old_triggers:
            statement = f"drop trigger {trigger};\n{statement}"
        made.append(((order[files[trigger]], 1, trigger), Change(trigger, statement,
                                                                 files[trigger])))  # fmt: skip
    return changes + [change for _, change in sorted(made, key=lambda item: item[0])]


def _statement(pattern: re.Pattern[str], text: str, name: str) -> str:
    """The source file's statement that creates `name` (the file's function, or its trigger)."""
    for match in pattern.finditer(text):
        if pattern is _CREATE_FUNCTION or name.split(" on ")[0].strip('"') == match.group(1):
            return match.group(0) + "\n"
    raise errors.MigrationError(f"No statement in the source creates {name}.")


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


def _write(path: Path, text: str) -> None:
    """Write `path` whole or not at all."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: make migration NAME=what_it_changes", file=sys.stderr)
        return 2
    name = args[0]
    folder = shipped.folder()
    try:
        version, parts, _before = target(name)
    except errors.PgflowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    path = folder / f"{version}_{name}.sql"
    waiting = path.with_name(path.name + DRAFT_SUFFIX)
    base = Path(tempfile.mkdtemp(prefix="pgflow-writer-"))
    server = embedded.EmbeddedServer(base, embedded.default_bin_dir(), fast=True, local=False)
    try:
        written = draft(server.ensure_started(), name)
    except errors.PgflowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if isinstance(exc, TableChangesMissing) and not waiting.exists():
            _write(waiting, render(parts, []))
            print(f"wrote {waiting}: write its hand-written section, then run this again")
        return 1
    finally:
        server.destroy()
    existed = path.exists()
    if not existed and not written.changes and not parts.hand_written:
        print(
            "error: Nothing in the source differs from the migrations: no migration to write.\n"
            "HINT: Edit pgflow_gen/runtime/sql/source/ first (a table change: write it in the"
            " hand-written section of the draft this writes).",
            file=sys.stderr,
        )
        return 1
    _write(path, written.text)
    waiting.unlink(missing_ok=True)
    print(f"{'rewrote' if existed else 'wrote'} {path}: {counted(len(written.changes), 'change')}")
    for change in written.changes:
        print(f"  {change.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

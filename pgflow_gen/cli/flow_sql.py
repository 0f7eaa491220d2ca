"""The generated flow migrations (`<out>/migrations/<flow>.sql`) delivered to a database: applied
directly (`pgflow-gen db apply`), or exported as versioned files for the migration tool a project
already uses (`pgflow-gen db export`: Flyway, dbmate, Supabase, Alembic).

Applying is idempotent: each file runs in its own transaction and says what happened to its
flow (compiled, verified, recompiled); a flow that differs from its definition in a production
database fails its file, which changes nothing, and stops the run.

Exporting never rewrites history: a ledger (`pgflow-gen.exports.json` in the target folder)
remembers the SQL hash of every file it wrote, and a flow gets a new file, with the next number,
only when its SQL changed. Numbers come from the ledger, never from a clock, so the output is
deterministic and two exports of the same input write the same files.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psycopg

from pgflow_gen.engine import support
from pgflow_gen.errors import PgflowError, UsageError

Style = Literal["flyway", "dbmate", "supabase", "alembic"]
STYLES: tuple[Style, ...] = ("flyway", "dbmate", "supabase", "alembic")
LEDGER = "pgflow-gen.exports.json"


def migration_files(folder: Path) -> list[Path]:
    """The generated flow migrations of an output folder (or of its `migrations/` folder), in
    name order; UsageError when there are none."""
    source = folder / "migrations" if (folder / "migrations").is_dir() else folder
    files = sorted(source.glob("*.sql"))
    if not files:
        raise UsageError(
            f"No generated flow migrations in {source}.",
            hint="Run `pgflow-gen build` first, and pass its --out folder.",
        )
    return files


@dataclass(frozen=True)
class Applied:
    path: Path
    outcome: str  # what the migration reported: "flow hello compiled", ...


def apply(
    conn: psycopg.Connection[Any], files: list[Path], on_applied: Callable[[Applied], None]
) -> list[Applied]:
    """Run each file in its own transaction, in order; stop at the first that fails."""
    support.require(conn)
    notices: list[str] = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    done = []
    for path in files:
        notices.clear()
        try:
            with conn.transaction():
                conn.execute(path.read_text(encoding="utf-8").encode())
        except psycopg.Error as exc:
            diag = exc.diag
            raise FlowMigrationError(
                f"{path.name} failed and changed nothing: {diag.message_primary or exc}",
                detail=diag.message_detail,
                hint=diag.message_hint,
            ) from exc
        outcome = next((n for n in notices if n.startswith("flow ")), "applied")
        done.append(Applied(path, outcome))
        on_applied(done[-1])
    return done


class FlowMigrationError(PgflowError):
    """A generated flow migration failed (a flow that differs in a production database); its
    transaction was rolled back."""

    code = "flow_migration_failed"


@dataclass(frozen=True)
class Exported:
    flow: str
    path: Path


def export(
    files: list[Path], target: Path, style: Style, *, first_version: int = 1
) -> list[Exported]:
    """Write a versioned file into `target` for every flow whose SQL changed since the last
    export (all of them the first time), numbered on from the ledger (from `first_version` in
    a new folder); return what was written."""
    target.mkdir(parents=True, exist_ok=True)
    ledger_path = target / LEDGER
    ledger: dict[str, Any] = (
        json.loads(ledger_path.read_text()) if ledger_path.exists() else {"exports": []}
    )
    if ledger.get("style", style) != style:
        raise UsageError(
            f"{target} holds {ledger['style']} exports; it cannot take {style} ones.",
            hint="Export each style into its own folder.",
        )
    latest: dict[str, str] = {}
    for entry in ledger["exports"]:
        latest[entry["flow"]] = entry["sha256"]
    number = max((entry["number"] for entry in ledger["exports"]), default=first_version - 1)
    written = []
    for path in files:
        flow = path.stem
        sql = path.read_text(encoding="utf-8")
        digest = hashlib.sha256(sql.encode()).hexdigest()
        if latest.get(flow) == digest:
            continue
        number += 1
        previous = [e for e in ledger["exports"] if e["flow"] == flow]
        name, text = _render(
            style, number, flow, sql, previous[-1]["revision"] if previous else None
        )
        (target / name).write_text(text, encoding="utf-8")
        ledger["exports"].append(
            {"number": number, "flow": flow, "sha256": digest, "file": name,
             "revision": _revision(flow, number)}
        )  # fmt: skip
        written.append(Exported(flow, target / name))
    ledger["style"] = style
    ledger_path.write_text(json.dumps(ledger, indent=2) + "\n", encoding="utf-8")
    return written


def _revision(flow: str, number: int) -> str:
    return f"pgflow_{number:04d}_{flow}"


def _render(
    style: Style, number: int, flow: str, sql: str, down_revision: str | None
) -> tuple[str, str]:
    """The file name and text of one exported migration."""
    slug = flow.lower()
    if style == "flyway":
        return f"V{number}__pgflow_{slug}.sql", sql
    if style == "dbmate":
        body = f"-- migrate:up\n{sql}\n-- migrate:down\n-- flows are immutable: no down migration\n"
        return f"{number:014d}_pgflow_{slug}.sql", body
    if style == "supabase":
        return f"{number:014d}_pgflow_{slug}.sql", sql
    revision = _revision(flow, number)
    lines = "".join(f"    {line!r}\n" for line in sql.splitlines(keepends=True))
    body = (
        f'"""pgflow-gen: register flow {flow} (generated by `pgflow-gen db export`)."""\n\n'
        "from alembic import op\n\n"
        f"revision = {revision!r}\n"
        f"down_revision = {down_revision!r}\n"
        f"branch_labels = {('pgflow_' + slug,) if down_revision is None else None!r}\n"
        "depends_on = None\n\n"
        f"SQL = (\n{lines})\n\n\n"
        "def upgrade() -> None:\n"
        "    # A DB-API cursor runs it as it is: SQLAlchemy and the driver would read `:name` and\n"
        "    # `%` in it as parameters. Same connection, same transaction as Alembic's.\n"
        "    op.get_bind().connection.cursor().execute(SQL)\n\n\n"
        "def downgrade() -> None:\n"
        "    pass  # flows are immutable: a new shape is a new flow slug\n"
    )
    return f"{revision}.py", body

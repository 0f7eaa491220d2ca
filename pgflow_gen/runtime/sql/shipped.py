"""The engine SQL this package ships: the readable source files (one object each), the
append-only numbered migrations and the checksums of the released ones. Reading them needs no
database driver (`pgflow-gen --version` names the newest); `runtime/migrations.py` applies them.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

_MIGRATION_NAME = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")
_SQL_PACKAGE = "pgflow_gen.runtime.sql"


@dataclass(frozen=True)
class Migration:
    """One numbered engine migration file."""

    version: str
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def available() -> tuple[Migration, ...]:
    """Every engine migration shipped with this package, in version order."""
    folder = resources.files(_SQL_PACKAGE).joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = _MIGRATION_NAME.match(entry.name)
        if match:
            found.append(Migration(match["version"], match["name"], entry.read_text("utf-8")))
    return tuple(sorted(found, key=lambda m: m.version))


def released() -> dict[str, str]:
    """The released engine migrations as {version: checksum} (`released.json`): each never
    changes again (a test checks the files against it; `make migration` rewrites none)."""
    text = resources.files(_SQL_PACKAGE).joinpath("released.json").read_text("utf-8")
    return {str(version): str(checksum) for version, checksum in json.loads(text).items()}


def folder() -> Path:
    """The migrations' folder in this checkout (where `make migration` writes)."""
    return Path(str(resources.files(_SQL_PACKAGE).joinpath("migrations")))


def source_files() -> tuple[tuple[str, str], ...]:
    """The engine source, one object per file, as (file name, SQL) in file-name order."""
    folder = resources.files(_SQL_PACKAGE).joinpath("source")
    entries = sorted((e for e in folder.iterdir() if e.name.endswith(".sql")), key=lambda e: e.name)
    return tuple((e.name, e.read_text("utf-8")) for e in entries)

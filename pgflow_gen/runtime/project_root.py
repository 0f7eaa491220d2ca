"""Which project a folder belongs to, found as git finds its repository: from the folder up, the
nearest one whose `pyproject.toml` has a `[tool.pgflow-gen]` table, else the nearest one that has
an embedded server already (its `.pgflow/`, or its data under /var/tmp/pgflow-gen/ as root),
else the folder itself. Commands and workers run from a subfolder (`app/`) so use the project's
one embedded server instead of starting a second one.

>>> find(Path("/")) == Path("/")
True
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from pgflow_gen.runtime import embedded


def find(start: Path) -> Path:
    """The project root of `start` (see the module docstring)."""
    return find_project(start) or start.resolve()


def find_project(start: Path) -> Path | None:
    """The nearest folder from `start` up that is a project: its `pyproject.toml` declares
    `[tool.pgflow-gen]`, else it has an embedded server; None when none is."""
    start = start.resolve()
    chain = [start, *start.parents]
    for folder in chain:
        if _declares_pgflow_gen(folder / "pyproject.toml"):
            return folder
    for folder in chain:
        if (embedded.project_base_dir(folder) / "pgdata" / "PG_VERSION").is_file():
            return folder
    return None


def _declares_pgflow_gen(path: Path) -> bool:
    try:
        data = path.read_bytes()
    except OSError:  # no such file, or one we may not read
        return False
    try:
        tool = tomllib.loads(data.decode("utf-8", errors="replace")).get("tool", {})
    except tomllib.TOMLDecodeError:
        # Still the project's root: the CLI reports the file in its own words when it reads it.
        return b"[tool.pgflow-gen" in data
    return isinstance(tool, dict) and "pgflow-gen" in tool

"""A worker sends the shape of its generated `FLOW` (`Flow.shape()`), and the generated migration
embeds the shape the generator built: for every golden case and example they are one shape, so
the migration and the workers describe the flow the same way (its description hash included)."""

from __future__ import annotations

import importlib
import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
MIGRATIONS = sorted(
    [
        *ROOT.glob("tests/golden/cases/*/expected/migrations/*.sql"),
        *ROOT.glob("examples/*/app/pgflow/migrations/*.sql"),
    ]
)
#: The shape argument of ensure_flow_compiled: the second literal, before `::jsonb`.
SHAPE = re.compile(
    r"pgflow\.ensure_flow_compiled\(\n\s+'(?:[^']|'')*',\n\s+'((?:[^']|'')*)'::jsonb"
)


@contextmanager
def importable(package: Path) -> Iterator[str]:
    """The generated package's dotted name, importable for the block: its project folder on
    sys.path, and no module of an earlier package of the same name (every golden case's is
    `expected`) in sys.modules, before or after."""
    parts, root = [package.name], package.parent
    while (root / "__init__.py").is_file():
        parts.insert(0, root.name)
        root = root.parent

    def forget() -> None:
        for name in [m for m in sys.modules if m == parts[0] or m.startswith(f"{parts[0]}.")]:
            del sys.modules[name]

    forget()
    sys.path.insert(0, str(root))
    try:
        yield ".".join(parts)
    finally:
        sys.path.remove(str(root))
        forget()


def flow_of(migration: Path) -> Any:
    """The generated module beside the migration (it imports the runtime, and the modules of
    the flows its subflow steps run), its FLOW."""
    package = migration.parent.parent
    manifest = json.loads((package / "pgflow-gen.manifest.json").read_text())
    modules = [f for f in manifest["files"] if "/" not in f and f.endswith(".py")]
    with importable(package) as dotted:
        for name in modules:
            if name == "__init__.py":
                continue
            module = importlib.import_module(f"{dotted}.{name[:-3]}")
            if module.FLOW.slug == migration.stem:
                return module.FLOW
    raise AssertionError(f"no flow module for {migration}")


@pytest.mark.parametrize(
    "migration", MIGRATIONS, ids=[str(p.relative_to(ROOT)) for p in MIGRATIONS]
)
def test_the_workers_shape_is_the_migrations_shape(migration: Path) -> None:
    found = SHAPE.search(migration.read_text())
    assert found is not None, migration
    embedded = json.loads(found[1].replace("''", "'"))
    assert flow_of(migration).shape() == embedded


def test_there_are_shapes_with_signal_and_subflow_steps_among_them() -> None:
    texts = [path.read_text() for path in MIGRATIONS]
    assert any('"stepType": "signal"' in text for text in texts)
    assert any('"stepType": "subflow"' in text for text in texts)
    assert any('"stepType": "map"' in t and '"subflowSlug"' in t for t in texts)

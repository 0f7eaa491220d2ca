"""A worker sends the shape of its generated `FLOW` (`Flow.shape()`), and the generated migration
embeds the shape the generator built: for every golden case and example they are one shape, so
the migration and the workers describe the flow the same way (its description hash included)."""

from __future__ import annotations

import importlib.util
import json
import re
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


def flow_of(migration: Path) -> Any:
    """The generated module beside the migration (it imports only the runtime), its FLOW."""
    package = migration.parent.parent
    manifest = json.loads((package / "pgflow-gen.manifest.json").read_text())
    modules = [f for f in manifest["files"] if "/" not in f and f.endswith(".py")]
    for name in modules:
        if name == "__init__.py":
            continue
        spec = importlib.util.spec_from_file_location(f"shape_check_{name[:-3]}", package / name)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
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


def test_there_are_shapes_with_signal_steps_among_them() -> None:
    texts = [path.read_text() for path in MIGRATIONS]
    assert any('"stepType": "signal"' in text for text in texts)

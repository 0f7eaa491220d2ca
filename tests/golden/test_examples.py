"""The committed output of every example is exactly what `pgflow-gen build` generates now."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgflow_gen.codegen import build

ROOT = Path(__file__).parents[2]
# The examples, and the project the end-to-end tests run: both commit their generated output.
EXAMPLES = [
    *sorted(p for p in (ROOT / "examples").iterdir() if (p / "flows").is_dir()),
    ROOT / "tests" / "e2e" / "project",
    ROOT / "benchmarks" / "project",
]


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_output_is_current(example: Path) -> None:
    specs = sorted((example / "flows").glob("*.yaml"))
    out = example / "app" / "pgflow"
    files = build.generate(specs, package="app.pgflow", project=example)
    outcome = build.apply(files, out, check=True)
    assert not outcome.stale, "".join(outcome.diffs)


def test_check_mode_reports_changed_missing_and_orphaned_files(tmp_path: Path) -> None:
    example = EXAMPLES[0]
    specs = sorted((example / "flows").glob("*.yaml"))
    files = build.generate(specs, package="app.pgflow", project=example)
    out = tmp_path / "pgflow"
    build.apply(files, out, check=False)
    (out / "Procfile").write_text("edited\n")
    first_module = next(
        p for p in files if p.endswith(".py") and "/" not in p and p != "__init__.py"
    )
    (out / first_module).unlink()
    manifest = out / "pgflow-gen.manifest.json"
    manifest.write_text(
        manifest.read_text().replace('"files": {', '"files": {\n    "old.py": "x",')
    )
    (out / "old.py").write_text("# stale\n")
    stranger = out / "hand_written.py"
    stranger.write_text("# not generated\n")

    outcome = build.apply(files, out, check=True)
    assert sorted(outcome.written) == sorted(["Procfile", first_module, "pgflow-gen.manifest.json"])
    assert outcome.removed == ["old.py"]
    assert (out / "old.py").exists()

    build.apply(files, out, check=False)
    assert not (out / "old.py").exists()
    assert stranger.exists()
    assert not build.apply(files, out, check=True).stale

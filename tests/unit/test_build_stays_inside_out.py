"""Generated output stays inside --out: orphan removal deletes only manifest entries inside it,
a manifest or symlink that leads out is an error and nothing is written or removed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pgflow_gen import cli
from pgflow_gen.codegen import build

SPEC = """\
slug: tiny
steps:
  - slug: only
    handler: app.handlers:only
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "project" / "flows").mkdir(parents=True)
    (tmp_path / "project" / "flows" / "tiny.yaml").write_text(SPEC)
    (tmp_path / "project" / "app").mkdir()
    (tmp_path / "project" / "app" / "handlers.py").write_text("def only(v, ctx, /): ...\n")
    monkeypatch.chdir(tmp_path / "project")
    return tmp_path / "project"


def built(project: Path) -> tuple[dict[str, str], Path]:
    files = build.generate([project / "flows" / "tiny.yaml"], package="app.pgflow", project=project)
    out = project / "app" / "pgflow"
    build.apply(files, out, check=False)
    return files, out


def list_in_manifest(out: Path, *entries: str) -> None:
    manifest = out / "pgflow-gen.manifest.json"
    document = json.loads(manifest.read_text())
    document["files"].update({entry: "0" * 64 for entry in entries})
    manifest.write_text(json.dumps(document))


def snapshot(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


@pytest.mark.parametrize(
    "entry",
    ["../outside.txt", "../../outside.txt", "workers/../../outside.txt", "{outside}"],
    ids=["parent", "grandparent", "inner-parent", "absolute"],
)
def test_a_manifest_entry_outside_out_is_an_error_and_nothing_is_deleted(
    project: Path, entry: str, capsys: pytest.CaptureFixture[str]
) -> None:
    files, out = built(project)
    outside = project / "app" / "outside.txt"
    if entry.count("../") == 2:
        outside = project / "outside.txt"
    outside.write_text("the user's file\n")
    entry = entry.format(outside=outside)
    (out / "old_orphan.py").write_text("# a legitimate orphan, listed below\n")
    list_in_manifest(out, entry, "old_orphan.py")
    before = snapshot(project)

    with pytest.raises(build.UnsafeOutputPathError) as raised:
        build.apply(files, out, check=False)
    assert f'lists "{entry}", which leads outside' in raised.value.message
    assert snapshot(project) == before, "nothing may be written or removed"

    assert cli.main(["build", "flows", "--out", "app/pgflow"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"error: {out.relative_to(project)}/pgflow-gen.manifest.json lists")
    assert snapshot(project) == before
    assert cli.main(["build", "flows", "--out", "app/pgflow", "--check"]) == cli.EXIT_USAGE


def test_an_orphan_behind_a_symlink_that_leads_out_is_not_deleted(project: Path) -> None:
    files, out = built(project)
    elsewhere = project / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.py").write_text("# the user's file\n")
    (out / "linked").symlink_to(elsewhere, target_is_directory=True)
    list_in_manifest(out, "linked/keep.py")

    with pytest.raises(build.UnsafeOutputPathError):
        build.apply(files, out, check=False)
    assert (elsewhere / "keep.py").read_text() == "# the user's file\n"


def test_an_orphan_that_is_a_symlink_to_a_file_outside_is_not_followed(project: Path) -> None:
    files, out = built(project)
    target = project / "precious.py"
    target.write_text("# the user's file\n")
    (out / "old.py").symlink_to(target)
    list_in_manifest(out, "old.py")

    with pytest.raises(build.UnsafeOutputPathError):
        build.apply(files, out, check=False)
    assert target.read_text() == "# the user's file\n"
    assert (out / "old.py").is_symlink()


def test_a_generated_file_is_not_written_through_a_symlink_that_leads_out(project: Path) -> None:
    files, out = built(project)
    elsewhere = project / "elsewhere"
    elsewhere.mkdir()
    migrations = out / "migrations"
    for path in migrations.iterdir():
        path.unlink()
    migrations.rmdir()
    migrations.symlink_to(elsewhere, target_is_directory=True)

    with pytest.raises(build.UnsafeOutputPathError) as raised:
        build.apply(files, out, check=False)
    assert raised.value.message.startswith('The build writes "migrations/tiny.sql"')
    assert list(elsewhere.iterdir()) == []


def test_orphans_inside_out_are_removed_and_unlisted_files_are_kept(project: Path) -> None:
    files, out = built(project)
    (out / "workers" / "gone").mkdir()
    (out / "workers" / "gone" / "step.py").write_text("# orphan\n")
    (out / "handwritten.py").write_text("# not generated\n")
    list_in_manifest(out, "workers/gone/step.py")

    outcome = build.apply(files, out, check=False)
    assert outcome.removed == ["workers/gone/step.py"]
    assert not (out / "workers" / "gone" / "step.py").exists()
    assert (out / "handwritten.py").exists()


def test_headers_name_a_spec_at_the_project_root_by_its_file(tmp_path: Path) -> None:
    (tmp_path / "tiny.yaml").write_text(SPEC)
    files = build.generate([tmp_path / "tiny.yaml"], package="app.pgflow", project=tmp_path)
    assert files["Procfile"].startswith("# Code generated by pgflow-gen from tiny.yaml. DO NOT")
    assert files["__init__.py"].startswith("# Code generated by pgflow-gen from tiny.yaml. DO")
    assert files["tiny.py"].startswith("# Code generated by pgflow-gen from tiny.yaml. DO NOT")


def test_headers_never_hold_an_absolute_path(tmp_path: Path) -> None:
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "tiny.yaml").write_text(SPEC)
    project = tmp_path / "project"
    project.mkdir()
    files = build.generate(
        [tmp_path / "specs" / "tiny.yaml"], package="app.pgflow", project=project
    )
    for relative, content in files.items():
        assert str(tmp_path) not in content, relative
    assert files["tiny.py"].startswith("# Code generated by pgflow-gen from ../specs/tiny.yaml.")


def test_a_flow_mode_migration_passes_a_null_route_map_on_its_own_line(project: Path) -> None:
    files, _ = built(project)
    lines = files["migrations/tiny.sql"].splitlines()
    assert "    'flow'," in lines
    assert lines[lines.index("    'flow',") + 1] == "    null"

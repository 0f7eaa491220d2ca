"""The project root is found from any folder inside the project, as git finds its repository
(runtime/project_root.py), so commands and workers run from `app/` use the project's one
embedded server."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgflow_gen.runtime import embedded, project_root

DECLARED = '[project]\nname = "shop"\n\n[tool.pgflow-gen]\nspecs = ["flows"]\n'


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text(DECLARED)
    (tmp_path / "app" / "pgflow").mkdir(parents=True)
    return tmp_path


def test_a_subfolder_belongs_to_the_nearest_project_that_declares_pgflow_gen(
    project: Path,
) -> None:
    assert project_root.find(project / "app" / "pgflow") == project
    assert project_root.find(project) == project


def test_a_pyproject_without_the_table_is_not_a_project_root(project: Path) -> None:
    (project / "app" / "pyproject.toml").write_text('[project]\nname = "app"\n')
    assert project_root.find(project / "app" / "pgflow") == project


def test_a_nested_project_is_its_own_root(project: Path) -> None:
    (project / "app" / "pyproject.toml").write_text(DECLARED)
    assert project_root.find(project / "app" / "pgflow") == project / "app"


def test_a_malformed_pyproject_that_names_the_table_still_marks_the_root(project: Path) -> None:
    (project / "pyproject.toml").write_text("[tool.pgflow-gen\nspecs = [")
    assert project_root.find(project / "app") == project


@pytest.fixture
def embedded_data(tmp_path: Path) -> Iterator[Path]:
    """A folder with an embedded server's data (its PG_VERSION), and no pyproject.toml."""
    base = embedded.project_base_dir(tmp_path)
    (base / "pgdata").mkdir(parents=True)
    (base / "pgdata" / "PG_VERSION").write_text("18\n")
    yield tmp_path
    shutil.rmtree(base, ignore_errors=True)


def test_without_a_declaring_pyproject_the_nearest_embedded_server_marks_the_root(
    embedded_data: Path,
) -> None:
    (embedded_data / "app").mkdir()
    assert project_root.find(embedded_data / "app") == embedded_data


def test_a_folder_of_no_project_is_its_own_root(tmp_path: Path) -> None:
    assert project_root.find(tmp_path) == tmp_path

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pgflow_gen.runtime import database, embedded


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in database.ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def test_an_explicit_url_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGFLOW_DATABASE_URL", "postgresql://env/a")
    assert database.configured_url("postgresql://flag/b") == "postgresql://flag/b"


def test_pgflow_database_url_comes_before_database_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://generic/a")
    monkeypatch.setenv("PGFLOW_DATABASE_URL", "postgresql://specific/b")
    assert database.configured_url() == "postgresql://specific/b"


def test_database_url_is_used_when_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://generic/a")
    assert database.resolve_url() == "postgresql://generic/a"


def test_nothing_configured_means_the_embedded_default() -> None:
    assert database.configured_url() is None


def test_the_embedded_data_lives_in_the_project_unless_root(tmp_path: Path) -> None:
    base = embedded.project_base_dir(tmp_path)
    if os.geteuid() == 0:
        assert base.parent == embedded.ROOT_BASE
        assert base != embedded.project_base_dir(tmp_path / "other")
    else:
        assert base == tmp_path.resolve() / ".pgflow"


def test_a_long_base_dir_gets_a_short_socket_directory(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)
    server = embedded.EmbeddedServer(deep, Path("/nonexistent/bin"))
    assert len(str(server.socket_dir)) < 60
    assert server.url().startswith("postgresql://postgres@/postgres?host=/tmp/pgflow-")


def test_a_short_base_dir_holds_its_own_socket(tmp_path: Path) -> None:
    server = embedded.EmbeddedServer(tmp_path, Path("/nonexistent/bin"))
    assert server.socket_dir == tmp_path

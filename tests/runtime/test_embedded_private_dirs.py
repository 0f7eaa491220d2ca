"""As root the embedded server runs as a system user; binaries it cannot reach (a virtual
environment under a 0700 directory) run from a copy, and the user's directory stays private."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

import psycopg
import pytest

from pgflow_gen.runtime import embedded

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="only root hands the server to a system user"
)


def copy_of_the_binaries(home: Path, mode: int) -> Path:
    """The wheel's installation, laid out as in site-packages, under `home` with `mode`."""
    wheel_bin = embedded.default_bin_dir()
    package = wheel_bin.parent.parent
    site = home / "site-packages"
    shutil.copytree(package, site / package.name, symlinks=True)
    libs = package.with_name(f"{package.name}.libs")
    if libs.is_dir():
        shutil.copytree(libs, site / libs.name, symlinks=True)
    home.chmod(mode)
    return site / package.name / wheel_bin.parent.name / wheel_bin.name


def test_a_server_starts_from_binaries_under_a_private_directory(tmp_path: Path) -> None:
    home = tmp_path / "home"
    bin_dir = copy_of_the_binaries(home, 0o700)
    assert not embedded._service_user_can_run(bin_dir)

    cluster = Path(tempfile.mkdtemp(prefix="pgflow-test-"))  # as the test server's (conftest)
    server = embedded.EmbeddedServer(cluster, bin_dir, fast=True, local=False)
    try:
        with psycopg.connect(server.ensure_started(), autocommit=True) as conn:
            row = conn.execute("select current_setting('data_directory')").fetchone()
        assert row == (str(server.pgdata),)
    finally:
        server.destroy()

    copied = embedded.service_bin_dir(bin_dir)
    assert copied != bin_dir
    assert copied.is_relative_to(embedded.ROOT_BASE)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700, "the user's directory stays private"


def test_reachable_binaries_are_used_in_place() -> None:
    home = Path(tempfile.mkdtemp(prefix="pgflow-reachable-"))  # /tmp: traversable by all
    try:
        bin_dir = copy_of_the_binaries(home, 0o755)
        assert embedded.service_bin_dir(bin_dir) == bin_dir
    finally:
        shutil.rmtree(home)

"""The wheel carries everything the package reads at run time: engine SQL, templates (`init`'s
too), schemas, and the testing kit's pytest plugin entry point."""

from __future__ import annotations

import subprocess
import venv
from pathlib import Path

import pytest

from tests import packaging

CHECK = """
import importlib.util
from pathlib import Path
# Located without importing it: the wheel is installed without its dependencies.
package = Path(importlib.util.find_spec("pgflow_gen").submodule_search_locations[0])
required = [
    "py.typed",
    "runtime/sql/migrations/0001_initial.sql",
    "runtime/sql/source/0141_function_complete_task.sql",
    "_data/templates/flow_module.py.jinja",
    "_data/templates/init/pyproject.toml.jinja",
    "_data/templates/init/tests/test_hello.py.jinja",
    "_data/schemas/README.md",
    "testing/plugin.py",
]
missing = [name for name in required if not package.joinpath(name).is_file()]
assert not missing, missing
assert "site-packages" in str(package), package
from importlib.metadata import entry_points
plugins = [e.value for e in entry_points(group="pytest11") if e.name == "pgflow"]
assert plugins == ["pgflow_gen.testing.plugin"], plugins
print("ok")
"""


@pytest.mark.slow
def test_the_installed_wheel_contains_its_data_files(tmp_path: Path) -> None:
    wheel = packaging.build_wheel(tmp_path / "dist")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)],
        check=True,
        capture_output=True,
    )
    result = subprocess.run(
        [str(python), "-c", CHECK], check=True, capture_output=True, text=True, cwd=tmp_path
    )
    assert result.stdout.strip() == "ok"

"""The files of a new project (`pgflow-gen init`): a two-step flow in queue mode step, typed
handlers, a test written with the testing kit, `[tool.pgflow-gen]` in pyproject.toml, and a
README that says how to install it (pgflow-gen from where this one came from, `origin`).

The files are templates under `templates/init/` (`<path>.jinja`, `gitignore.jinja` for
`.gitignore`); this module decides their names and context, and writes nothing.
"""

from __future__ import annotations

import re

from pgflow_gen.codegen import templates

#: Each file of a new project, relative to its folder.
FILES = (
    ".gitignore",
    "README.md",
    "pyproject.toml",
    "flows/hello.yaml",
    "app/__init__.py",
    "app/handlers.py",
    "tests/test_hello.py",
)


def project_name(folder_name: str) -> str:
    """A distribution name from a folder name (PEP 503 normalized), `my-flows` by default.

    >>> project_name("My Flows!")
    'my-flows'
    """
    name = re.sub(r"[^A-Za-z0-9]+", "-", folder_name).strip("-").lower()
    return name or "my-flows"


def project_files(name: str, requirement: str) -> dict[str, str]:
    """Path -> text of every file of a new project called `name`, which depends on pgflow-gen
    through `requirement` (`origin.installed_requirement()` for the one that runs)."""
    files = {}
    for path in FILES:
        template = "init/gitignore.jinja" if path == ".gitignore" else f"init/{path}.jinja"
        files[path] = templates.render(template, project=name, requirement=requirement)
    return files

"""The Jinja environment: StrictUndefined, no autoescape, LF newlines, templates that only print.

Templates live in `templates/` of the source tree and in `pgflow_gen/_data/templates` of the wheel.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

import jinja2


def template_dir() -> Path:
    installed = Path(str(resources.files("pgflow_gen"))) / "_data" / "templates"
    if installed.is_dir():
        return installed
    return Path(__file__).resolve().parents[2] / "templates"


def sql_literal(value: str) -> str:
    """A standard SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


@functools.cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        newline_sequence="\n",
    )
    env.filters["sql_literal"] = sql_literal
    return env


def render(name: str, **context: object) -> str:
    """Render a template; the result ends with exactly one newline."""
    return environment().get_template(name).render(**context).rstrip("\n") + "\n"

"""Loading a spec file: YAML (with positions) -> pydantic models -> whole-flow checks.

Every problem of a file is collected and raised together as SpecErrors; nothing else escapes
for bad input (a test feeds random and mutated specs to prove it).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pydantic
from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from pgflow_gen.spec import checks, model
from pgflow_gen.spec.locate import Locator, plain
from pgflow_gen.spec.problems import Location, Problem, SpecErrors


def load_file(path: Path, *, display_name: str | None = None) -> model.FlowSpec:
    """Load and validate one spec file; raise SpecErrors listing every problem."""
    name = display_name or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SpecErrors(
            [Problem("not_utf8", f"The file is not UTF-8: {exc.reason}.", Location(name))]
        ) from exc
    except OSError as exc:
        raise SpecErrors(
            [Problem("unreadable", f"Cannot read the file: {exc.strerror}.", Location(name))]
        ) from exc
    return load_text(text, name)


def load_text(text: str, file: str) -> model.FlowSpec:
    """Load and validate spec text; `file` names it in error locations."""
    yaml = YAML(typ="safe", pure=False)  # the C loader when ruamel.yaml.clib is installed
    yaml.allow_duplicate_keys = False
    try:
        data = yaml.load(io.StringIO(text))
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        location = Location(
            file, None if mark is None else mark.line + 1, None if mark is None else mark.column + 1
        )
        message = (exc.problem or exc.context or "invalid YAML").strip()
        raise SpecErrors(
            [Problem("yaml_syntax", f"YAML syntax error: {message}.", location)]
        ) from exc
    except YAMLError as exc:  # errors without a position
        raise SpecErrors([Problem("yaml_syntax", f"YAML error: {exc}.", Location(file))]) from exc

    locator = Locator(file, text)
    if not isinstance(data, dict):
        raise SpecErrors(
            [
                Problem(
                    "not_a_mapping",
                    "A flow spec is a YAML mapping (slug, steps, ...).",
                    locator.at(()),
                    hint="Start the file with `slug: myFlow`.",
                )
            ]
        )
    try:
        spec = model.FlowSpec.model_validate(plain(data))
    except pydantic.ValidationError as exc:
        raise SpecErrors([_schema_problem(error, locator) for error in exc.errors()]) from exc
    problems = checks.check(spec, locator)
    if problems:
        raise SpecErrors(problems)
    return spec


def _schema_problem(error: Any, locator: Locator) -> Problem:
    keys = tuple(k for k in error["loc"] if isinstance(k, str | int))
    location = locator.at(keys)
    kind = error["type"]
    field = str(keys[-1]) if keys else "spec"
    ctx = error.get("ctx") or {}
    if kind == "extra_forbidden":
        return Problem(
            "unknown_key", f'Unknown key "{field}".', location,
            hint="Check the spelling; keys are snake_case (see schemas/flow.schema.json).",
        )  # fmt: skip
    if kind == "missing":
        return Problem("missing_key", f'Missing required key "{field}".', location)
    if kind in ("less_than_equal", "less_than"):
        return Problem(
            "out_of_range", f'"{field}" must be at most {ctx.get("le", ctx.get("lt"))}.', location,
            detail=f"Got {error.get('input')!r}.",
        )  # fmt: skip
    if kind in ("greater_than_equal", "greater_than"):
        return Problem(
            "out_of_range", f'"{field}" must be at least {ctx.get("ge", ctx.get("gt"))}.', location,
            detail=f"Got {error.get('input')!r}.",
        )  # fmt: skip
    if kind == "string_pattern_mismatch" and field == "handler":
        return Problem(
            "invalid_handler_path", f"Invalid handler path {error.get('input')!r}.", location,
            hint='Write "package.module:function", for example "app.handlers:classify".',
        )  # fmt: skip
    if kind == "literal_error":
        return Problem(
            "invalid_value", f'Invalid value {error.get("input")!r} for "{field}".', location,
            hint=f"Expected {ctx.get('expected', 'one of the documented values')}.",
        )  # fmt: skip
    return Problem("invalid_value", f'"{field}": {error["msg"]}.', location)

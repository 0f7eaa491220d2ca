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

from pgflow_gen.errors import excerpt
from pgflow_gen.spec import checks, limits, model
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
    too_big = limits.check(text, file)
    if too_big:
        raise SpecErrors(too_big)
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
    data = plain(data)
    try:
        spec = model.FlowSpec.model_validate(data)
    except pydantic.ValidationError as exc:
        raise SpecErrors(_schema_problems(exc.errors(), data, locator)) from exc
    problems = checks.check(spec, locator)
    if problems:
        raise SpecErrors(problems)
    return spec


def _schema_problems(errors: list[Any], data: Any, locator: Locator) -> list[Problem]:
    """One problem per place: the errors pydantic reports for each member of a union (`type:
    []` is neither a type name nor a non-empty list) become one."""
    grouped: dict[tuple[str | int, ...], list[Any]] = {}
    for error in errors:
        grouped.setdefault(_data_keys(error, data), []).append(error)
    problems = []
    for keys, found in grouped.items():
        if len(found) == 1:
            problems.append(_schema_problem(found[0], keys, locator))
            continue
        field = str(keys[-1]) if keys else "spec"
        reasons = dict.fromkeys(str(error["msg"]) for error in found)
        problems.append(
            Problem(
                "invalid_value",
                f'Invalid value {excerpt(repr(found[0].get("input")))} for "{field}".',
                locator.at(keys),
                hint=f"{'; or '.join(reasons)}.",
            )
        )
    return problems


def _data_keys(error: Any, data: Any) -> tuple[str | int, ...]:
    """The path of an error in the spec's data, without the names pydantic gives the members of
    a union (they are no keys of the file); a missing key keeps its name."""
    keys: list[str | int] = []
    node = data
    loc = [k for k in error["loc"] if isinstance(k, str | int)]
    for position, key in enumerate(loc):
        found, child = _child(node, key)
        if found:
            node = child
        elif not (error["type"] == "missing" and position == len(loc) - 1):
            continue
        keys.append(key)
    return tuple(keys)


def _child(node: Any, key: str | int) -> tuple[bool, Any]:
    if isinstance(node, dict) and key in node:
        return True, node[key]
    if isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
        return True, node[key]
    return False, None


def _schema_problem(error: Any, keys: tuple[str | int, ...], locator: Locator) -> Problem:
    location = locator.at(keys)
    kind = error["type"]
    field = str(keys[-1]) if keys else "spec"
    ctx = error.get("ctx") or {}
    given = excerpt(repr(error.get("input")))
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
            detail=f"Got {given}.",
        )  # fmt: skip
    if kind in ("greater_than_equal", "greater_than"):
        return Problem(
            "out_of_range", f'"{field}" must be at least {ctx.get("ge", ctx.get("gt"))}.', location,
            detail=f"Got {given}.",
        )  # fmt: skip
    if kind == "string_pattern_mismatch" and field == "handler":
        return Problem(
            "invalid_handler_path", f"Invalid handler path {given}.", location,
            hint='Write "package.module:function", for example "app.handlers:classify".',
        )  # fmt: skip
    if kind == "string_pattern_mismatch" and field == "table" and "triggers" in error["loc"]:
        return Problem(
            "invalid_trigger_table", f"Invalid table {given} for a trigger.", location,
            hint='Write the table with its schema, as unquoted names: "public.orders".',
        )  # fmt: skip
    if kind == "literal_error":
        return Problem(
            "invalid_value", f'Invalid value {given} for "{field}".', location,
            hint=f"Expected {ctx.get('expected', 'one of the documented values')}.",
        )  # fmt: skip
    return Problem("invalid_value", f'"{field}": {error["msg"]}.', location)

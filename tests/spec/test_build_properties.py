"""Property tests over the whole spec language: random flows (DAGs with maps, conditions, skip
modes, options, both queue modes), random slugs (keywords, builtins, case and underscore
variants), random schemas (`$defs` / `$ref`, `anyOf`, `enum`, `const`, nested objects and arrays,
`additionalProperties`) and awkward text, some of them invalid on purpose.

Invariants: `validate` accepts exactly the specs `build` accepts (and nothing but SpecErrors
escapes); every generated tree is `ruff format --check` and `ruff check` clean, and (sampled, in
a `slow` test) `mypy --strict` clean; the output is identical in processes with different hash
seeds; a rejected spec gets located errors with documented codes, and `validate` exits 2.

`make test` runs a bounded number of examples. A longer run:
`PGFLOW_PROPERTY_EXAMPLES=2000 .venv/bin/pytest tests/spec/test_build_properties.py`.
"""

from __future__ import annotations

import json
import keyword
import os
import re
import string
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from pgflow_gen import cli
from pgflow_gen.codegen import build
from pgflow_gen.spec import limits
from pgflow_gen.spec.problems import SpecErrors

ROOT = Path(__file__).parents[2]
EXAMPLES = int(os.environ.get("PGFLOW_PROPERTY_EXAMPLES", "40"))
DOCUMENTED_CODES = set(
    re.findall(r"^### `([a-z0-9_]+)`$", (ROOT / "docs" / "errors.md").read_text(), re.MULTILINE)
)


def examples(count: int) -> settings:
    return settings(
        max_examples=max(1, count * EXAMPLES // 40),
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
    )


# -- pools: what users write, and what breaks generators ----------------------------------

WORDS = sorted(
    {*keyword.kwlist, *keyword.softkwlist, "print", "input", "output", "type", "str", "list",
     "item", "items", "deps", "ctx", "value", "workers", "migrations", "run", "Json", "Literal",
     "Input", "Output", "Handlers", "StepSlug", "FLOW", "start_worker", "sys", "fooBar",
     "foo_bar", "FooBar", "foobar", "fooItem", "foo", "a_b", "aB", "abc1", "abc_1", "HTTPServer",
     "http_server", "v2", "V2", "x"}
)  # fmt: skip
KEYS = [
    "a", "", " ", "str", "int", "class", "from", "None", "match", "_", "__x", "a-b", "a_b", "aB",
    "AB", "a b", "item", "Item", "Value", "0", "1a", "\u00e9", "Json", "Literal", "Input",
    "Output", "'", '"', "\\", "a\nb", "$ref", "deps", "annotations", "x" * 70,
]  # fmt: skip
TEXTS = [
    "Plain text.", 'has """ triple quotes', 'ends with a quote"', "ends with \\", "tab\there",
    "line one\n\nline two", "nul \x00 byte", "\u2028separator", "x" * 150,
    " ".join(["word"] * 40), "'single' and \"double\"", "", "   ", "\u00fcn\u00efc\u00f6d\u00e9",
]  # fmt: skip
HANDLER_MODULES = [
    "app.handlers",
    "handlers",
    "app.class",
    "start_worker",
    "STEP_QUEUED_FLOW",
    "app.x" * 20,
    "pkg.sub.mod",
]  # fmt: skip (the first two are the common case)
SCALARS = ["string", "integer", "number", "boolean", "null"]


def slugs() -> st.SearchStrategy[str]:
    made = st.builds(
        lambda first, rest: first + rest,
        st.sampled_from(string.ascii_letters),
        st.text(string.ascii_letters + string.digits + "_", max_size=40),
    )
    return st.one_of(st.sampled_from(WORDS), made)


def rarely(draw: Callable[..., Any]) -> bool:
    """True about once in ten draws: for the invalid variants, so most specs stay valid."""
    return bool(draw(st.sampled_from((False,) * 9 + (True,))))  # shrinks toward False


def literals(odd: bool) -> st.SearchStrategy[Any]:
    """Literal values; with `odd`, floats too, which `enum` and `const` reject."""
    valid: list[st.SearchStrategy[Any]] = [
        st.none(),
        st.booleans(),
        st.integers(-(10**20), 10**20),
        st.sampled_from(KEYS),
    ]
    if odd:
        valid.append(st.floats(allow_nan=True, allow_infinity=True))
    return st.one_of(*valid)


def json_values() -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(10**20), 10**20),
        st.floats(allow_nan=True, allow_infinity=True, width=64),
        st.sampled_from(KEYS),
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)
        ),
        max_leaves=10,
    )


@st.composite
def schemas(draw: Callable[..., Any], defs: tuple[str, ...], depth: int = 0) -> dict[str, Any]:
    def child() -> dict[str, Any]:
        drawn: dict[str, Any] = draw(schemas(defs, depth + 1))
        return drawn

    kind = draw(st.integers(0, 9 if depth < 3 else 3))
    schema: dict[str, Any]
    if kind == 0:
        schema = {}
    elif kind == 1:
        schema = {"type": draw(st.sampled_from(SCALARS))}
    elif kind == 2:
        size = st.integers(0 if rarely(draw) else 1, 3)  # an empty list is rejected
        schema = {
            "type": draw(
                st.lists(st.sampled_from(SCALARS), min_size=draw(size), max_size=3, unique=True)
            )
        }
    elif kind == 3 and defs:
        target = "Missing" if rarely(draw) else draw(st.sampled_from(defs))
        schema = {"$ref": f"#/$defs/{target}"}
    elif kind == 3 or kind == 4:
        schema = {"enum": draw(st.lists(literals(rarely(draw)), min_size=1, max_size=12))}
    elif kind == 5:
        schema = {"const": draw(literals(rarely(draw)))}
    elif kind == 6:
        schema = {"anyOf": [child() for _ in range(draw(st.integers(1, 3)))]}
    elif kind == 7:
        schema = {"type": "array"}
        if draw(st.booleans()):
            schema["items"] = child()
    else:
        keys = draw(st.lists(st.sampled_from(KEYS), max_size=5, unique=True))
        schema = {"type": "object"}
        if keys:
            schema["properties"] = {key: child() for key in keys}
            required = draw(st.lists(st.sampled_from(keys), unique=True))
            schema["required"] = [*required, "notAKey"] if rarely(draw) else required
        extra = draw(st.integers(0, 2))
        if extra:
            schema["additionalProperties"] = child() if extra == 2 else draw(st.booleans())
    if draw(st.integers(0, 5)) == 0:
        schema["description"] = draw(st.sampled_from(TEXTS))
    return schema


@st.composite
def deep_schemas(draw: Callable[..., Any]) -> dict[str, Any]:
    """A chain of nested arrays, objects and unions around the nesting limit (`spec_too_deep`):
    YAML levels from the top of the file are what the limit counts, so some just fit and some
    do not."""
    levels = draw(st.integers(limits.MAX_DEPTH - 8, limits.MAX_DEPTH + 2))
    schema: dict[str, Any] = {"type": draw(st.sampled_from(SCALARS))}
    depth = 4  # the file, "steps", the step and its "output"
    while True:
        kind = draw(st.sampled_from(["array", "object", "anyOf"]))
        cost = 1 if kind == "array" else 2
        if depth + cost > levels:
            return schema
        depth += cost
        if kind == "array":
            schema = {"type": "array", "items": schema}
        elif kind == "object":
            schema = {"type": "object", "properties": {"x": schema}, "required": ["x"]}
        else:
            schema = {"anyOf": [schema, {"type": "null"}]}


@st.composite
def root_schemas(draw: Callable[..., Any], array: bool = False) -> dict[str, Any]:
    names = tuple(draw(st.lists(st.sampled_from(["Item", "Name", "a_b", "aB", "Input", "x1"]),
                                max_size=3, unique=True)))  # fmt: skip
    schema = {"type": "array", "items": draw(schemas(names, 1))} if array else draw(schemas(names))
    if names:
        # A definition may refer to one listed after it; rarely to any, so cycles happen too.
        schema["$defs"] = {
            name: draw(schemas(names if rarely(draw) else names[index + 1 :], 1))
            for index, name in enumerate(names)
        }
    return schema


@st.composite
def specs(draw: Callable[..., Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"slug": draw(slugs())}
    mode = draw(st.sampled_from(["flow", "step", None]))
    if mode is not None:
        spec["queue_mode"] = mode
    if draw(st.booleans()):
        spec["description"] = draw(st.sampled_from(TEXTS))
    root_map = draw(st.integers(0, 3)) == 0
    if root_map or draw(st.booleans()):
        spec["input"] = draw(root_schemas(array=root_map))
    if draw(st.integers(0, 3)) == 0:
        low = 0 if rarely(draw) else 1  # 0 attempts and a 2 s timeout are rejected
        spec["options"] = {
            "max_attempts": draw(st.integers(low, 5)),
            "timeout": draw(st.integers(low + 2, 99)),
        }
    steps: list[dict[str, Any]] = []
    for index in range(draw(st.integers(0, 6))):
        step: dict[str, Any] = {"slug": draw(slugs())}
        module = draw(st.sampled_from(HANDLER_MODULES if rarely(draw) else HANDLER_MODULES[:2]))
        function = "def" if rarely(draw) else draw(st.sampled_from(["run", "handle_it"]))
        step["handler"] = f"{module}:{function}"
        earlier = [s["slug"] for s in steps]
        is_map = draw(st.integers(0, 3)) == 0 or (root_map and index == 0)
        if is_map:
            step["type"] = "map"
            # A map without "array" maps the run input: only where it is an array, or rarely.
            if earlier and not (root_map and draw(st.booleans())) and not rarely(draw):
                step["array"] = draw(st.sampled_from(earlier))
        elif earlier:
            deps = draw(st.lists(st.sampled_from(earlier), max_size=3, unique=True))
            if deps:
                step["depends_on"] = deps
        if draw(st.integers(0, 4)) == 0:
            step["if"] = {draw(st.sampled_from(KEYS)): draw(json_values())}
            step["when_unmet"] = draw(st.sampled_from(["skip", "skip-cascade", "fail"]))
        if draw(st.integers(0, 4)) == 0:
            step["if_not"] = {draw(st.sampled_from(KEYS)): draw(json_values())}
        if draw(st.integers(0, 4)) == 0:
            step["when_exhausted"] = draw(st.sampled_from(["fail", "skip", "skip-cascade"]))
        if draw(st.integers(0, 4)) == 0:
            step["options"] = {"start_delay": draw(st.integers(0, 10**10 if rarely(draw) else 60))}
        if draw(st.booleans()):
            step["output"] = draw(root_schemas(array=draw(st.booleans())))
        elif draw(st.integers(0, 9)) == 0:
            step["output"] = draw(deep_schemas())
        steps.append(step)
    if steps:
        spec["steps"] = steps
    if draw(st.integers(0, 4)) == 0:
        spec["workers"] = {"max_concurrent": draw(st.integers(1, 50))}
        if steps and spec.get("queue_mode") == "step":
            spec["workers"]["steps"] = {steps[0]["slug"]: {"max_concurrent": 2}}
    return spec


def dump(spec: dict[str, Any]) -> str:
    buffer = StringIO()
    YAML(typ="safe").dump(spec, buffer)
    return buffer.getvalue()


# -- helpers ---------------------------------------------------------------------------------


@contextmanager
def project(*texts: str) -> Iterator[tuple[Path, list[Path]]]:
    with tempfile.TemporaryDirectory(prefix="pgflow-prop-") as folder:
        root = Path(folder)
        (root / "flows").mkdir()
        paths = []
        for index, text in enumerate(texts):
            path = root / "flows" / f"flow{index}.yaml"
            path.write_text(text, encoding="utf-8")
            paths.append(path)
        yield root, paths


def outcome(root: Path, paths: list[Path]) -> dict[str, str] | SpecErrors:
    try:
        return build.generate(paths, package="app.pgflow", project=root)
    except SpecErrors as errors:
        return errors


def write_tree(root: Path, files: dict[str, str]) -> Path:
    out = root / "app" / "pgflow"
    build.apply(files, out, check=False)
    (root / "app" / "__init__.py").write_text("")
    return out


def ruff(*args: str, target: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--config", str(ROOT / "pyproject.toml"),
         "--no-cache", str(target)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


# -- invariants ------------------------------------------------------------------------------


@examples(60)
@given(specs())
def test_validate_accepts_exactly_what_build_accepts(spec: dict[str, Any]) -> None:
    with project(dump(spec)) as (root, paths):
        try:
            build.load(paths, project=root)  # what `pgflow-gen validate` runs
            valid = True
        except SpecErrors:
            valid = False
        result = outcome(root, paths)  # anything but SpecErrors fails the test here
        assert isinstance(result, dict) == valid


@examples(40)
@given(specs())
def test_generated_trees_are_ruff_clean(spec: dict[str, Any]) -> None:
    with project(dump(spec)) as (root, paths):
        result = outcome(root, paths)
        assume(not isinstance(result, SpecErrors))  # the budget goes to specs that build
        assert not isinstance(result, SpecErrors)
        out = write_tree(root, result)
        formatted = ruff("format", "--check", "--diff", target=out)
        assert formatted.returncode == 0, formatted.stdout + formatted.stderr
        checked = ruff("check", "--output-format", "concise", target=out)
        assert checked.returncode == 0, checked.stdout + checked.stderr


def handler_stubs(root: Path, files: dict[str, str]) -> None:
    """A module for every handler module the worker entry files import, with each function they
    use taking and returning anything: mypy checks the generated code, not the handlers."""
    functions: dict[str, set[str]] = {}
    for content in files.values():
        # Entry files import their handlers inside a `try:` (indented).
        for module, alias in re.findall(r"^\s*import ([\w.]+)(?: as (\w+))?$", content, re.M):
            if module == "sys":
                continue
            reference = re.escape(alias or module)
            used = re.findall(rf"(?<![\w.]){reference}\.(\w+)", content)
            functions.setdefault(module, set()).update(used)
    for module, names in functions.items():
        parts = module.split(".")
        for end in range(1, len(parts)):
            init = root.joinpath(*parts[:end], "__init__.py")
            init.parent.mkdir(parents=True, exist_ok=True)
            init.touch()
        body = "".join(
            f"\n\ndef {name}(*args: Any, **kwargs: Any) -> Any: ...\n" for name in sorted(names)
        )
        path = root.joinpath(*parts[:-1], f"{parts[-1]}.py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"from typing import Any\n{body}")


@pytest.mark.slow
@examples(5)
@given(specs().filter(lambda spec: bool(spec.get("steps"))))
def test_generated_trees_pass_mypy_strict(spec: dict[str, Any]) -> None:
    with project(dump(spec)) as (root, paths):
        result = outcome(root, paths)
        assume(not isinstance(result, SpecErrors))  # the budget goes to specs that build
        assert not isinstance(result, SpecErrors)
        write_tree(root, result)
        handler_stubs(root, result)
        checked = subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--config-file",
             os.devnull, "--explicit-package-bases", "app"],
            cwd=root, env=dict(os.environ, MYPYPATH=str(root)), capture_output=True, text=True,
            check=False,
        )  # fmt: skip
        assert checked.returncode == 0, checked.stdout


IMPORT_FLOW_MODULES = """
import importlib, pathlib, sys
import pydantic
root = pathlib.Path(sys.argv[1])
sys.path.insert(0, str(root))
for path in sorted((root / "app" / "pgflow").glob("*.py")):
    module = importlib.import_module(f"app.pgflow.{path.stem}")
    if hasattr(module, "FLOW"):
        # As the Client validates run inputs; outputs the same way.
        pydantic.TypeAdapter(module.Input)
        pydantic.TypeAdapter(module.Output)
"""


@examples(10)
@given(specs())
def test_generated_flow_modules_import_and_build_their_types(spec: dict[str, Any]) -> None:
    """At runtime too: aliases, unions and TypedDicts evaluate, and pydantic builds validators
    for the input and output types (as the Client does for run inputs)."""
    with project(dump(spec)) as (root, paths):
        result = outcome(root, paths)
        assume(not isinstance(result, SpecErrors))
        assert not isinstance(result, SpecErrors)
        write_tree(root, result)
        imported = subprocess.run(
            [sys.executable, "-c", IMPORT_FLOW_MODULES, str(root)],
            cwd=root, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert imported.returncode == 0, imported.stderr


BUILD_ALL = """
import json, sys
from pathlib import Path
from pgflow_gen.codegen import build
from pgflow_gen.spec import limits
from pgflow_gen.spec.problems import SpecErrors
root = Path(sys.argv[1])
results = {}
for path in sorted((root / "flows").glob("*.yaml")):
    try:
        results[path.name] = build.generate([path], package="app.pgflow", project=root)
    except SpecErrors as errors:
        results[path.name] = [problem.render() for problem in errors.problems]
json.dump(results, sys.stdout)
"""


@examples(6)
@given(st.lists(specs(), min_size=3, max_size=8))
def test_output_is_identical_across_processes_and_hash_seeds(specs: list[dict[str, Any]]) -> None:
    with project(*(dump(spec) for spec in specs)) as (root, _):
        runs = [
            json.loads(
                subprocess.run(
                    [sys.executable, "-c", BUILD_ALL, str(root)],
                    env=dict(os.environ, PYTHONHASHSEED=seed), cwd=ROOT,
                    capture_output=True, text=True, check=True,
                ).stdout
            )
            for seed in ("1", "2")
        ]  # fmt: skip
        assert runs[0] == runs[1]
        assert len(runs[0]) == len(specs)


@examples(40)
@given(specs())
def test_a_rejected_spec_gets_located_documented_errors_and_exit_2(spec: dict[str, Any]) -> None:
    text = dump(spec)
    with project(text) as (root, paths):
        result = outcome(root, paths)
        old = Path.cwd()
        os.chdir(root)
        try:
            code = cli.main(["validate", "flows", "--format", "json"])
        finally:
            os.chdir(old)
    if isinstance(result, dict):
        assert code == cli.EXIT_OK
        return
    assert code == cli.EXIT_USAGE
    lines = text.count("\n") + 1
    for problem in result.problems:
        assert problem.code in DOCUMENTED_CODES, problem.code
        assert problem.message
        assert problem.location.file == "flows/flow0.yaml"
        assert problem.location.line is not None, problem.render()
        assert 1 <= problem.location.line <= lines, problem.render()

"""Specs that abuse the parser fail fast: an alias bomb, a recursive alias and a schema nested
thousands of levels deep are refused with their location before anything is built, and the
deepest spec `validate` accepts also builds.

The commands run as subprocesses under a CPU-time and an address-space limit, so a regression
(the alias bomb used to run for minutes and grow past 3.7 GB) fails the test instead of the
machine. The limits are generous: they bound a runaway, not the speed of the machine.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pgflow_gen.codegen import build
from pgflow_gen.spec import limits, loader
from pgflow_gen.spec.problems import Problem, SpecErrors

CPU_SECONDS = 60
MEMORY_BYTES = 2 * 1024**3

ALIAS_BOMB = """\
slug: bombFlow
a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
steps: [{slug: one, handler: "app.handlers:one"}]
"""


def _bounded() -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


def pgflow_gen(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real command, bounded in CPU time and memory."""
    return subprocess.run(
        [sys.executable, "-m", "pgflow_gen.cli", *args],
        cwd=cwd, capture_output=True, text=True, check=False, preexec_fn=_bounded,
    )  # fmt: skip


def nested_objects(levels: int) -> str:
    schema = "{type: string}"
    for _ in range(levels):
        schema = f"{{type: object, properties: {{x: {schema}}}}}"
    return schema


def deep_spec(levels: int) -> str:
    return (
        "slug: deepFlow\nsteps:\n  - slug: one\n    handler: app.handlers:one\n"
        f"    output: {nested_objects(levels)}\n"
    )


def project(tmp_path: Path, text: str) -> Path:
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "f.yaml").write_text(text, encoding="utf-8")
    return tmp_path


def problems_of(text: str) -> list[Problem]:
    with pytest.raises(SpecErrors) as raised:
        loader.load_text(text, "flows/f.yaml")
    return list(raised.value.problems)


def test_an_alias_bomb_is_refused_with_its_location(tmp_path: Path) -> None:
    result = pgflow_gen(project(tmp_path, ALIAS_BOMB), "validate", "flows")
    assert result.returncode == 2, result.stderr
    assert "flows/f.yaml:7:" in result.stderr  # the alias that passes the limit, in "f"
    assert "error[spec_too_large]" in result.stderr
    assert "aliases count as every value they repeat" in result.stderr
    assert "lol" not in result.stderr  # no value of the input is repeated back
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["validate", "build"])
@pytest.mark.parametrize("levels", [200, 3000])
def test_a_schema_nested_too_deep_is_refused_by_validate_and_build(
    tmp_path: Path, command: str, levels: int
) -> None:
    out = ["--out", "app/pgflow"] if command == "build" else []
    result = pgflow_gen(project(tmp_path, deep_spec(levels)), command, "flows", *out)
    assert result.returncode == 2, result.stderr
    assert "flows/f.yaml:5:" in result.stderr
    assert f"The spec nests deeper than {limits.MAX_DEPTH} levels." in result.stderr
    assert '"$defs"' in result.stderr  # the hint says how to flatten it
    assert "internal error" not in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "app").exists()


def test_a_recursive_alias_is_refused_where_it_points_back() -> None:
    [problem] = problems_of("slug: a\nsteps: &s [{slug: b, handler: 'a.b:c', x: *s}]\n")
    assert problem.code == "recursive_alias"
    assert (problem.location.line, problem.location.column) == (2, 43)
    assert problem.location.path == "steps[0].x"
    assert '"*s"' in problem.message


def test_aliases_that_repeat_a_little_load_as_copies() -> None:
    spec = loader.load_text(
        textwrap.dedent(
            """\
            slug: shared
            steps:
              - {slug: one, handler: "app.h:one", options: &retry {max_attempts: 5, timeout: 30}}
              - {slug: two, handler: "app.h:two", depends_on: [one], options: *retry}
            """
        ),
        "flows/f.yaml",
    )
    assert spec.steps[0].options == spec.steps[1].options
    assert spec.steps[1].options is not None
    assert spec.steps[1].options.max_attempts == 5


def deepest(levels: int) -> str:
    """A spec whose innermost value sits exactly `levels` YAML levels down, through arrays:
    the file (1), "steps" (2), the step (3), its output (4) and one level per array."""
    schema = "{type: string}"
    for _ in range(levels - 4):
        schema = f"{{type: array, items: {schema}}}"
    return f"slug: deepFlow\nsteps:\n  - {{slug: one, handler: 'app.h:one', output: {schema}}}\n"


def test_the_deepest_spec_validate_accepts_builds_and_one_level_more_is_refused(
    tmp_path: Path,
) -> None:
    path = project(tmp_path, deepest(limits.MAX_DEPTH)) / "flows" / "f.yaml"
    files = build.generate([path], package="app.pgflow", project=tmp_path)
    module = files["deep_flow.py"]
    compile(module, "deep_flow.py", "exec")  # the nested annotation is valid Python
    assert module.count("list[") >= limits.MAX_DEPTH - 4

    [problem] = problems_of(deepest(limits.MAX_DEPTH + 1))
    assert problem.code == "spec_too_deep"
    assert problem.location.path == "steps[0].output" + ".items" * (limits.MAX_DEPTH - 3)


def test_an_alias_cannot_carry_a_value_past_the_nesting_limit() -> None:
    inner = nested_objects(limits.MAX_DEPTH // 2 - 1)  # 63 levels: fits under "x"
    text = f"slug: a\nx: &deep {inner}\nsteps:\n  - {{slug: b, handler: 'a.b:c', output: *deep}}\n"
    [problem] = problems_of(text)
    assert problem.code == "spec_too_deep"
    assert problem.location.line == 4


def test_a_huge_value_is_shown_cut_in_its_message() -> None:
    handler = "x" * 100_000
    [problem] = problems_of(f"slug: a\nsteps: [{{slug: b, handler: {handler}}}]\n")
    assert problem.code == "invalid_handler_path"
    assert len(problem.render()) < 400
    assert "(100,002 characters)" in problem.message  # the repr's quotes count


def test_a_large_legal_spec_validates_and_builds(tmp_path: Path) -> None:
    steps = []
    for index in range(500):
        depends = f", depends_on: [s{index - 1}, s{index // 2}]" if index > 1 else ""
        steps.append(
            f"  - {{slug: s{index}, handler: 'app.handlers:step_{index}'{depends},"
            " output: {type: object, properties: {n: {type: integer}, tags: {type: array,"
            " items: {type: string}}}, required: [n]}}"
        )
    text = (
        "slug: bigFlow\nqueue_mode: step\nsteps:\n"
        + "\n".join(steps).replace("depends_on: [s1, s1]", "depends_on: [s1]")
        + "\n"
    )
    root = project(tmp_path, text)
    validated = pgflow_gen(root, "validate", "flows")
    assert validated.returncode == 0, validated.stderr
    built = pgflow_gen(root, "build", "flows", "--out", "app/pgflow")
    assert built.returncode == 0, built.stderr
    assert (root / "app" / "pgflow" / "big_flow.py").read_text().count("class ") >= 500
    assert len(list((root / "app" / "pgflow" / "workers" / "big_flow").glob("*.py"))) >= 500

"""codegen/layout.py lays expressions out exactly as `ruff format` does: random type
annotations, dict entries, aliases, keyword arguments and display values of every length, in the
places the templates use, come back from ruff unchanged."""

from __future__ import annotations

import string
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgflow_gen.codegen import layout
from pgflow_gen.codegen.layout import Atom, Expr, Group, Pair, Union

ROOT = Path(__file__).parents[2]
NAMES = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from(string.ascii_uppercase),
    st.text(string.ascii_letters, min_size=0, max_size=63),
)
STRINGS = st.one_of(
    st.text(string.ascii_lowercase, max_size=20),
    st.text(string.ascii_lowercase + " ", min_size=60, max_size=110),  # longer than a line
).map(lambda s: f'"{s}"')


def types() -> st.SearchStrategy[Expr]:
    atoms = st.one_of(NAMES, st.sampled_from(["str", "int", "None", "Json"])).map(Atom)

    def grow(inner: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
        not_union = inner.filter(lambda e: not isinstance(e, Union))
        return st.one_of(
            st.builds(lambda e, h: Group(h, "[", "]", (e,)), inner,
                      st.sampled_from(["list", "NotRequired"])),
            st.builds(lambda e: Group("dict", "[", "]", (Atom("str"), e)), inner),
            st.lists(STRINGS.map(Atom), min_size=1, max_size=12).map(
                lambda items: Group("Literal", "[", "]", tuple(items))
            ),
            st.lists(not_union, min_size=2, max_size=4).map(lambda items: Union(tuple(items))),
        )  # fmt: skip

    return st.recursive(atoms, grow, max_leaves=12)


def values() -> st.SearchStrategy[Expr]:
    atoms = st.one_of(STRINGS, st.sampled_from(["True", "None", "1", "2147483647"])).map(Atom)

    def grow(inner: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
        return st.one_of(
            st.lists(inner, max_size=5).map(lambda items: Group("", "[", "]", tuple(items))),
            st.lists(STRINGS.map(Atom), min_size=1, max_size=6).map(
                lambda items: Group("", "(", ")", tuple(items))
            ),
            st.lists(st.tuples(STRINGS, inner), max_size=5).map(
                lambda pairs: Group("", "{", "}", tuple(Pair(k, ": ", v) for k, v in pairs))
            ),
        )

    return st.recursive(atoms, grow, max_leaves=12)


def module(
    fields: list[Expr], entries: list[Expr], aliases: list[Expr], arguments: list[Expr]
) -> str:
    """The expressions in the places the templates print them."""
    out = ["from typing import Literal, NotRequired, TypeAlias, TypedDict", "", "", "class A:"]
    for i, expr in enumerate(fields):
        out += layout.lines(expr, indent=4, prefix=f"k{i}: ")
    out += ["", "", "B = TypedDict(", '    "B",', "    {"]
    for i, expr in enumerate(entries):
        out += layout.lines(Pair(f'"k{i}"', ": ", expr), indent=8, suffix=",")
    out += ["    },", ")"]
    for i, expr in enumerate(aliases):
        out += ["", *layout.lines(expr, indent=0, prefix=f"Alias{i}: TypeAlias = ")]
    out += [
        "",
        "C = (",
        "    Step(",
        "        Inner(",
    ]
    for i, expr in enumerate(arguments):
        out += layout.lines(Pair(f"arg{i}", "=", expr), indent=12, suffix=",")
    out += ["        ),", "    ),", ")"]
    return "\n".join(out) + "\n"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(types(), min_size=1, max_size=8),
    st.lists(types(), min_size=1, max_size=8),
    st.lists(types(), min_size=1, max_size=8),
    st.lists(values(), min_size=1, max_size=8),
)
def test_ruff_format_leaves_the_layout_unchanged(
    fields: list[Expr], entries: list[Expr], aliases: list[Expr], arguments: list[Expr]
) -> None:
    source = module(fields, entries, aliases, arguments)
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--config", str(ROOT / "pyproject.toml"),
         "--stdin-filename", "generated.py", "-"],
        input=source, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert result.stdout == source
    checked = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--config", str(ROOT / "pyproject.toml"),
         "--select", "E501,RUF100", "--stdin-filename", "generated.py", "-"],
        input=source, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout


def test_a_statement_that_fits_stays_on_one_line() -> None:
    expr = Group("list", "[", "]", (Atom("int"),))
    assert layout.lines(expr, indent=4, prefix="key: ") == ["    key: list[int]"]


def test_a_long_union_is_parenthesized_and_split_before_each_operator() -> None:
    names = [Atom("A" * 50), Atom("B" * 50), Atom("None")]
    assert layout.lines(Union(tuple(names)), indent=0, prefix="X: TypeAlias = ") == [
        "X: TypeAlias = (",
        f"    {'A' * 50}",
        f"    | {'B' * 50}",
        "    | None",
        ")",
    ]

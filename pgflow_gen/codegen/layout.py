"""Long lines laid out as `ruff format` lays them out, so generated code is formatted by
construction whatever the lengths of names, enums and condition patterns.

Generated expressions are small trees: atoms (names, literals), bracketed groups (`list[...]`,
`Literal[...]`, calls, dicts, tuples), unions (`A | B`) and pairs (`"key": value`, `key=value`).
A statement that fits in the line length is one line. Otherwise, as ruff (and Black) do: a group
splits after its opening bracket, its items on one indented line if they fit there, else one item
per line with a trailing comma (a single item stands alone, without one; a list, tuple or dict
display always has one item per line once split); a union splits before
each `|`, inside parentheses where the statement allows them; an atom that fits on a line of its
own is put in parentheses where allowed, and is otherwise left long.
"""

from __future__ import annotations

from dataclasses import dataclass

LINE_LENGTH = 100
INDENT = 4
NO_LINE_LENGTH_CHECK = "# noqa: E501"


@dataclass(frozen=True)
class Atom:
    text: str


@dataclass(frozen=True)
class Group:
    """`head` followed by `items` in brackets: `list[X]`, `Step(a=1)`, `{"k": v}`, `("a",)`."""

    head: str
    open: str
    close: str
    items: tuple[Expr, ...]

    @property
    def one_tuple(self) -> bool:
        """A tuple of one item, whose trailing comma is syntax, not a layout choice."""
        return self.open == "(" and not self.head and len(self.items) == 1


@dataclass(frozen=True)
class Union:
    items: tuple[Expr, ...]


@dataclass(frozen=True)
class Pair:
    """A dict entry (`"key": value`) or a keyword argument (`key=value`)."""

    key: str
    separator: str
    value: Expr


Expr = Atom | Group | Union | Pair


def flat(expr: Expr) -> str:
    """The expression on one line.

    >>> flat(Union((Group("list", "[", "]", (Atom("int"),)), Atom("None"))))
    'list[int] | None'
    """
    if isinstance(expr, Atom):
        return expr.text
    if isinstance(expr, Union):
        return " | ".join(flat(item) for item in expr.items)
    if isinstance(expr, Pair):
        return f"{expr.key}{expr.separator}{flat(expr.value)}"
    inner = ", ".join(flat(item) for item in expr.items) + ("," if expr.one_tuple else "")
    return f"{expr.head}{expr.open}{inner}{expr.close}"


def names(expr: Expr) -> set[str]:
    """The names an expression refers to: atoms that are identifiers and the heads of groups,
    not the contents of string literals or the keys of pairs.

    >>> sorted(names(Group("Literal", "[", "]", (Atom('"Json"'),))))
    ['Literal']
    """
    if isinstance(expr, Atom):
        return {expr.text} if expr.text.isidentifier() else set()
    if isinstance(expr, Pair):
        return names(expr.value)
    found = {expr.head} if isinstance(expr, Group) and expr.head else set()
    return found.union(*(names(item) for item in expr.items))


def lines(expr: Expr, *, indent: int, prefix: str = "", suffix: str = "") -> list[str]:
    """`prefix + expr + suffix` at `indent`, where `prefix` ends a statement's left-hand side
    (`key: `, `Name: TypeAlias = `, `HANDLER = `): parentheses may wrap `expr` there.

    A line that no split can shorten (a long string of the user's deep inside a condition) is
    marked `# noqa: E501`, unless it is one word, which ruff lets pass by itself."""
    return [
        f"{line}  {NO_LINE_LENGTH_CHECK}"
        if len(line) > LINE_LENGTH and any(c.isspace() for c in line.strip())
        else line
        for line in _lines(expr, indent, prefix, suffix, parenthesize=True)
    ]


def text(expr: Expr, *, indent: int, prefix: str = "", suffix: str = "") -> str:
    """`lines(...)` joined, without the first line's indentation (a template places it)."""
    return "\n".join(lines(expr, indent=indent, prefix=prefix, suffix=suffix))[indent:]


def _lines(expr: Expr, indent: int, prefix: str, suffix: str, *, parenthesize: bool) -> list[str]:
    pad = " " * indent
    one = f"{pad}{prefix}{flat(expr)}{suffix}"
    if len(one) <= LINE_LENGTH:
        return [one]
    if isinstance(expr, Pair):
        return _lines(
            expr.value, indent, f"{prefix}{expr.key}{expr.separator}", suffix, parenthesize=True
        )
    if isinstance(expr, Group) and expr.items:
        return [
            f"{pad}{prefix}{expr.head}{expr.open}",
            *_items(expr, indent + INDENT),
            f"{pad}{expr.close}{suffix}",
        ]
    inner = indent + INDENT
    if isinstance(expr, Union):
        if not parenthesize:
            return _operands(expr, indent, prefix, suffix)
        body = f"{' ' * inner}{flat(expr)}"
        operands = [body] if len(body) <= LINE_LENGTH else _operands(expr, inner, "", "")
        return [f"{pad}{prefix}(", *operands, f"{pad}){suffix}"]
    if parenthesize and prefix and len(" " * inner + flat(expr)) <= LINE_LENGTH:
        return [f"{pad}{prefix}(", f"{' ' * inner}{flat(expr)}", f"{pad}){suffix}"]
    return [one]


def _items(group: Group, indent: int) -> list[str]:
    if len(group.items) == 1 and not group.one_tuple:
        return _lines(group.items[0], indent, "", "", parenthesize=False)
    # A call or subscript keeps its items on one line when they fit; a display (list, tuple,
    # dict) split over lines has one item per line.
    together = " " * indent + ", ".join(flat(item) for item in group.items)
    if group.head and len(together) <= LINE_LENGTH:
        return [together]
    return [
        line for item in group.items for line in _lines(item, indent, "", ",", parenthesize=False)
    ]


def _operands(union: Union, indent: int, prefix: str, suffix: str) -> list[str]:
    found: list[str] = []
    last = len(union.items) - 1
    for position, item in enumerate(union.items):
        found += _lines(
            item,
            indent,
            prefix if position == 0 else "| ",
            suffix if position == last else "",
            parenthesize=False,
        )
    return found

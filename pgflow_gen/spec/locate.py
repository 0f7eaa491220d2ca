"""Positions in the loaded YAML: walk a key path through ruamel's round-trip nodes."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError

from pgflow_gen.spec.problems import Location


class Locator:
    """Turns a key path such as ("steps", 2, "handler") into a file location.

    Positions come from ruamel's round-trip parser, which is several times slower than the C
    loader used for the data itself, so the text is parsed for positions only when a problem
    needs one (valid specs never pay for it).
    """

    def __init__(self, file: str, text: str) -> None:
        self.file = file
        self._text = text
        self._root: Any = None
        self._parsed = False

    @property
    def root(self) -> Any:
        if not self._parsed:
            self._parsed = True
            try:
                self._root = YAML(typ="rt").load(self._text)
            except YAMLError:  # positions are a courtesy; the data was already loaded
                self._root = None
        return self._root

    def at(self, keys: Sequence[str | int]) -> Location:
        node = self.root
        line = column = None
        if isinstance(node, CommentedMap | CommentedSeq):
            line, column = node.lc.line, node.lc.col
        path = ""
        for key in keys:
            if isinstance(node, CommentedMap) and isinstance(key, str) and key in node:
                line, column = node.lc.key(key)
                path = f"{path}.{key}" if path else key
                node = node[key]
            elif isinstance(node, CommentedSeq) and isinstance(key, int) and 0 <= key < len(node):
                line, column = node.lc.item(key)
                path = f"{path}[{key}]"
                node = node[key]
            else:
                break
        return Location(
            self.file,
            None if line is None else line + 1,
            None if column is None else column + 1,
            path,
        )


def plain(node: Any) -> Any:
    """ruamel's round-trip containers and scalars as plain Python values."""
    if isinstance(node, dict):
        return {str(k) if not isinstance(k, str) else k: plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [plain(v) for v in node]
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    if isinstance(node, datetime.date):  # YAML timestamps: keep them JSON-compatible
        return node.isoformat()
    return node

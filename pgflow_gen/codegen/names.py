"""Every derived identifier, computed in one place (and golden-tested through the output)."""

from __future__ import annotations

import keyword
import re

_WORD_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def snake_case(slug: str) -> str:
    """`communityThreadsV1` -> `community_threads_v1`; a Python keyword gets a trailing `_`.

    >>> snake_case("communityThreadsV1"), snake_case("HTTPServer"), snake_case("import")
    ('community_threads_v1', 'http_server', 'import_')
    """
    name = _WORD_BOUNDARY.sub("_", slug).lower()
    return f"{name}_" if keyword.iskeyword(name) else name


def pascal_case(slug: str) -> str:
    """`deliverSlack` -> `DeliverSlack`, `list_helpers` -> `ListHelpers`.

    >>> pascal_case("deliverSlack"), pascal_case("list_helpers"), pascal_case("v2")
    ('DeliverSlack', 'ListHelpers', 'V2')
    """
    return "".join(part[:1].upper() + part[1:] for part in slug.split("_") if part)


def is_identifier(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name)

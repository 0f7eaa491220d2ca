"""A new project names pgflow-gen as pip recorded its install (PEP 610 `direct_url.json`)."""

from __future__ import annotations

import pytest

from pgflow_gen.codegen import origin


@pytest.mark.parametrize(
    ("direct_url", "expected"),
    [
        (None, "pgflow-gen[embedded,dashboard]>=1.2.0"),
        ({}, "pgflow-gen[embedded,dashboard]>=1.2.0"),
        (
            {"url": "file:///dist/pgflow_gen-1.2.0-py3-none-any.whl", "archive_info": {}},
            "pgflow-gen[embedded,dashboard] @ file:///dist/pgflow_gen-1.2.0-py3-none-any.whl",
        ),
        (
            {"url": "file:///src/mono", "dir_info": {}, "subdirectory": "pgflow-gen"},
            "pgflow-gen[embedded,dashboard] @ file:///src/mono#subdirectory=pgflow-gen",
        ),
        (
            {"url": "https://example.org/r.git", "vcs_info": {"vcs": "git"}},
            "pgflow-gen[embedded,dashboard] @ git+https://example.org/r.git",
        ),
    ],
)
def test_each_kind_of_install_gives_its_requirement(
    direct_url: dict[str, object] | None, expected: str
) -> None:
    assert origin.requirement(direct_url, "1.2.0") == expected

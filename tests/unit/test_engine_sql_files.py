"""House rules for the engine SQL: one object per file, named by kind, explained at the top."""

from __future__ import annotations

import re

import pytest

from pgflow_gen.runtime import migrations
from pgflow_gen.runtime.sql import shipped

SOURCE = shipped.source_files()
FILE_NAME = re.compile(r"^\d{4}_(schema|table|type|function|grant)_[a-z0-9_]+\.sql$")


@pytest.mark.parametrize(("name", "text"), SOURCE, ids=[n for n, _ in SOURCE])
def test_each_source_file_is_named_by_kind_and_opens_with_a_comment(name: str, text: str) -> None:
    assert FILE_NAME.match(name), name
    opening = text.splitlines()[:4]
    assert opening[0].startswith("-- "), f"{name} must open with comment lines saying what it does"


@pytest.mark.parametrize(("name", "text"), SOURCE, ids=[n for n, _ in SOURCE])
def test_each_function_pins_an_empty_search_path(name: str, text: str) -> None:
    if "_function_" in name:
        assert "set search_path = ''" in text, name
        assert text.count("create function") == 1, f"{name} must define exactly one function"


def test_migrations_are_numbered_without_gaps() -> None:
    versions = [int(m.version) for m in shipped.available()]
    assert versions == list(range(1, len(versions) + 1))


def test_the_engine_script_records_every_migration() -> None:
    script = migrations.engine_script()
    for migration in shipped.available():
        assert (
            f"values ('{migration.version}', '{migration.name}', '{migration.checksum}')" in script
        )

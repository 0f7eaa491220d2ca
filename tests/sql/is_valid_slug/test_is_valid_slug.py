"""Version 1 slug rule (pgflow's older one); migration 0002 tightens it."""

from __future__ import annotations

import pytest

from tests.engine import Engine

VALID = ["a", "greetUser", "greet_user", "_leading", "double__under", "trailing_", "x" * 128, "RUN"]
INVALID = ["", "1abc", "has-dash", "has space", "run", "x" * 129, "ümlaut", "a.b"]


@pytest.mark.parametrize("slug", VALID)
def test_accepts_letters_digits_and_underscores_not_starting_with_a_digit(
    engine: Engine, slug: str
) -> None:
    assert engine.value("select pgflow.is_valid_slug(%s)", slug) is True


@pytest.mark.parametrize("slug", INVALID)
def test_rejects_empty_long_reserved_and_foreign_characters(engine: Engine, slug: str) -> None:
    assert engine.value("select pgflow.is_valid_slug(%s)", slug) is False


def test_rejects_null(engine: Engine) -> None:
    assert engine.value("select pgflow.is_valid_slug(null)") is False

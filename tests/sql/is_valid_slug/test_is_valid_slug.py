"""The slug rule (engine version 2) against the shared naming vectors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pgflow_gen.naming import slug_violation
from tests.engine import Engine

VECTORS = json.loads((Path(__file__).parents[2] / "vectors" / "queue_names.json").read_text())


@pytest.mark.parametrize("case", VECTORS["slugs"], ids=lambda c: repr(c["slug"])[:20])
def test_matches_the_vectors(engine: Engine, case: dict[str, Any]) -> None:
    assert engine.value("select pgflow.is_valid_slug(%s)", case["slug"]) is case["valid"]


@pytest.mark.parametrize("case", VECTORS["slugs"], ids=lambda c: repr(c["slug"])[:20])
def test_explains_a_violation_in_the_words_of_the_python_rules(
    engine: Engine, case: dict[str, Any]
) -> None:
    violation = engine.value("select pgflow._slug_violation(%s)", case["slug"])
    assert violation == slug_violation(case["slug"])


def test_rejects_null(engine: Engine) -> None:
    assert engine.value("select pgflow.is_valid_slug(null)") is False

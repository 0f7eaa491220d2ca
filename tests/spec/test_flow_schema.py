"""The committed editor schema is exactly what the models export, and it agrees with the CLI."""

from __future__ import annotations

import json
from pathlib import Path

from pgflow_gen.spec import schema

COMMITTED = Path(__file__).parents[2] / "schemas" / "flow.schema.json"


def test_the_committed_schema_is_current() -> None:
    assert COMMITTED.read_text() == schema.export(), "run `make regen`"


def test_the_schema_forbids_unknown_keys_and_knows_the_aliases() -> None:
    document = json.loads(COMMITTED.read_text())
    assert document["additionalProperties"] is False
    step = document["$defs"]["StepSpec"]
    assert step["additionalProperties"] is False
    assert {"if", "if_not", "depends_on", "when_unmet"} <= set(step["properties"])
    assert step["required"] == ["slug"]
    assert step["oneOf"] == [
        {"required": ["handler"]},
        {"required": ["signal"]},
        {"required": ["flow"]},
    ]

"""`schemas/flow.schema.json`: the editor schema, exported from the same models the CLI uses.

Regenerate with `make regen`; a test fails when the committed file is stale.
"""

from __future__ import annotations

import json
import sys

from pgflow_gen.spec import model

SCHEMA_ID = "https://pgflow-gen.dev/schemas/flow.schema.json"


def export() -> str:
    """The JSON Schema of a flow spec file, deterministic (sorted keys, LF, final newline)."""
    schema = model.FlowSpec.model_json_schema(by_alias=True, mode="validation")
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        **schema,
    }
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    sys.stdout.write(export())

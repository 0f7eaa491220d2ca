"""Whether a value from YAML is a JSON value (a condition's pattern, a schedule's input): YAML
has dates, sets and non-finite floats that JSON does not.

>>> non_json({"a": [1, "x", None]}) is None
True
>>> non_json({"when": float("nan")})
'nan'
"""

from __future__ import annotations

import math
from typing import Any


def non_json(value: Any) -> str | None:
    """A description of the first value inside `value` that JSON cannot hold, or None."""
    if isinstance(value, dict):
        return next((bad for v in value.values() if (bad := non_json(v)) is not None), None)
    if isinstance(value, list):
        return next((bad for v in value if (bad := non_json(v)) is not None), None)
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if value is None or isinstance(value, str | int | float | bool):
        return None
    return f"a {type(value).__name__} value"

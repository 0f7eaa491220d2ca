"""What checking a handler's output against its step's output type costs a worker: the check
`startup.output_checks` compiles once per step, timed in process on typical outputs.

    .venv/bin/python benchmarks/output_check.py

`engine_throughput.py` (`make bench`) prints the same figures next to the engine's time per task.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from pgflow_gen.runtime import inputs

#: (what, schema, a valid output): a small object, a 10-field record, a list of 100 records.
RECORD = {
    "type": "object",
    "properties": {
        **{f"field{i}": {"type": "string"} for i in range(8)},
        "total": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["total"],
}
RECORD_VALUE: dict[str, Any] = {
    **{f"field{i}": f"value {i}" for i in range(8)},
    "total": 9.5,
    "tags": ["a", "b"],
}
CASES: list[tuple[str, dict[str, Any], Any]] = [
    (
        "enum object",
        {"type": "object", "properties": {"route": {"enum": ["help", "spam", "other"]}},
         "required": ["route"]},
        {"route": "help"},
    ),
    ("10-field record", RECORD, RECORD_VALUE),
    ("list of 100 records", {"type": "array", "items": RECORD}, [RECORD_VALUE] * 100),
]  # fmt: skip


def cost_us(schema: dict[str, Any], value: Any, seconds: float = 0.5) -> float:
    """Microseconds per check of `value`, measured for about `seconds`."""
    check = inputs.checker(schema)
    assert check(value) == [], "the sample output must be valid"
    count, began = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - began) < seconds:
        for _ in range(100):
            check(value)
        count += 100
    return elapsed / count * 1e6


def lines(task_us: float | None = None) -> list[str]:
    """One line per case; with `task_us` (the engine's time per task), the share of it."""
    found = []
    for what, schema, value in CASES:
        us = cost_us(schema, value)
        share = f", {us / task_us:.1%} of the engine's {task_us:.0f} us per task" if task_us else ""
        found.append(f"output check, {what}: {us:,.1f} us per output{share}")
    return found


if __name__ == "__main__":
    print("\n".join(lines()))
    sys.exit(0)

"""The project as a user installs it: its wheel, built from this tree without network access."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_wheel(dist: Path) -> Path:
    """Build pgflow-gen's wheel into `dist` and return its path."""
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist),
         str(ROOT)],
        check=True, capture_output=True,
    )  # fmt: skip
    [wheel] = dist.glob("pgflow_gen-*.whl")
    return wheel

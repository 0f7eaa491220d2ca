"""Golden cases: `cases/<case>/flow.yaml` (or `flows/*.yaml`, a build of several flows) with
`expected/` (the generated tree) or `expected_error.txt` (the rendered problems). `make regen`
rewrites them; review them as code."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from pgflow_gen.codegen import build
from pgflow_gen.spec.problems import SpecErrors

CASES = Path(__file__).parent / "cases"
PACKAGE = "expected"


def specs(case: Path) -> list[Path]:
    """The spec files of a case: its `flow.yaml`, or every file of its `flows/`."""
    if (case / "flows").is_dir():
        return sorted((case / "flows").glob("*.yaml"))
    return [case / "flow.yaml"]


def render_case(case: Path) -> dict[str, str] | str:
    """The generated files of a case, or the rendered error text of a failing one."""
    try:
        return build.generate(specs(case), package=PACKAGE, project=case)
    except SpecErrors as errors:
        return "\n".join(problem.render() for problem in errors.problems) + "\n"


def regenerate() -> None:
    for case in sorted(p for p in CASES.iterdir() if p.is_dir()):
        result = render_case(case)
        shutil.rmtree(case / "expected", ignore_errors=True)
        (case / "expected_error.txt").unlink(missing_ok=True)
        if isinstance(result, str):
            (case / "expected_error.txt").write_text(result)
        else:
            build.apply(result, case / "expected", check=False)
        print(f"regenerated {case.name}", file=sys.stderr)


if __name__ == "__main__":
    regenerate()

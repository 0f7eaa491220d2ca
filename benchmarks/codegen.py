"""Code generation speed: build and then check 200 flows of 20 steps each.

    .venv/bin/python benchmarks/codegen.py [--flows 200] [--steps 20]

Writes the specs and the output into a temporary folder inside the current directory (a real
project's disk; this machine's /tmp is several times slower at creating files) and removes it.
Prints the build and check times, and the time a bare loop takes to create the same files on
the same disk in the same run (the part of a cold build no generator can avoid).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from pgflow_gen.codegen import build


def write_specs(folder: Path, flows: int, steps: int) -> list[Path]:
    paths = []
    for f in range(flows):
        lines = [f"slug: benchFlow{f:03d}", "queue_mode: step", "input:", "  type: object",
                 "  properties: {id: {type: string}, count: {type: integer}}", "  required: [id]",
                 "steps:"]  # fmt: skip
        for s in range(steps):
            lines += [f"  - slug: step{s:02d}", f"    handler: app.handlers:step{s:02d}"]
            if s:
                lines.append(f"    depends_on: [step{s - 1:02d}]")
            if s % 5 == 4:
                lines.append(f"    if: {{step{s - 1:02d}: {{ok: true}}}}")
            lines.append(
                "    output: {type: object, properties: {ok: {type: boolean}}, required: [ok]}"
            )
        path = folder / f"flow_{f:03d}.yaml"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--flows", type=int, default=200)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix=".bench-codegen-", dir=Path.cwd()) as tmp:
        project = Path(tmp)
        (project / "flows").mkdir()
        specs = write_specs(project / "flows", args.flows, args.steps)
        out = project / "app" / "pgflow"

        started = time.perf_counter()
        files = build.generate(specs, package="app.pgflow", project=project)
        outcome = build.apply(files, out, check=False)
        built = time.perf_counter() - started

        started = time.perf_counter()
        files = build.generate(specs, package="app.pgflow", project=project)
        check = build.apply(files, out, check=True)
        checked = time.perf_counter() - started

        # The disk's own share: a bare loop creating the same files (same folders, same bytes).
        bare = project / "bare"
        started = time.perf_counter()
        for relative, content in files.items():
            target = bare / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8")
        written = time.perf_counter() - started
    assert not check.stale
    print(f"{args.flows} flows x {args.steps} steps: {len(outcome.written)} files")
    print(f"build: {built:.2f} s   check: {checked:.2f} s   (target: under 3 s each)")
    print(f"bare file creation of the same files, same run: {written:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

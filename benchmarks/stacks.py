"""Summarise sampled stacks: each function's share of the samples that were in it (inclusive).

    .venv/bin/python benchmarks/stacks.py FILE... [--top 40] [--match psycopg]

FILE is py-spy's collapsed format (`py-spy record --format raw`, what `e2e.py --py-spy DIR`
writes): one stack per line, its frames joined by `;`, then the number of samples. A function
counts once per stack however often it recurs in it; functions are named without line numbers,
so the lines of one function add up. `--match` keeps the functions whose name or file contains
the text.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

#: `name (file:line)` -> `name (file)`.
_LINE = re.compile(r":\d+\)$")


def inclusive(lines: Iterable[str]) -> tuple[Counter[str], int]:
    """(samples per function, all samples) of collapsed stack lines."""
    shares: Counter[str] = Counter()
    total = 0
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue  # a blank or foreign line
        samples = int(count)
        total += samples
        for frame in {_LINE.sub(")", frame) for frame in stack.split(";")}:
            shares[frame] += samples
    return shares, total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--match", default="")
    args = parser.parse_args(argv)
    lines: list[str] = []
    for file in args.files:
        try:
            lines += file.read_text().splitlines()
        except OSError as exc:
            print(f"stacks.py: cannot read {file}: {exc.strerror}", file=sys.stderr)
            return 1
    shares, total = inclusive(lines)
    if total == 0:
        print("stacks.py: no samples in these files", file=sys.stderr)
        return 1
    print(f"{total:,} samples")
    found = [(name, n) for name, n in shares.most_common() if args.match in name]
    for name, samples in found[: args.top]:
        print(f"{100 * samples / total:5.1f} %  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

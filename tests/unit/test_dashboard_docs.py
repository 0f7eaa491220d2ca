"""docs/dashboard.md shows every screenshot the browser test takes, and each is committed:
`make screenshots` refreshes them from tests/dashboard/test_browser.py."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_screenshot_of_the_browser_test_is_in_the_docs() -> None:
    taken = set(
        re.findall(
            r'shots\(page, "([a-z-]+)"\)', (ROOT / "tests/dashboard/test_browser.py").read_text()
        )
    )
    shown = set(
        re.findall(r"\(images/dashboard-([a-z-]+)\.png\)", (ROOT / "docs/dashboard.md").read_text())
    )
    committed = {
        path.stem.removeprefix("dashboard-")
        for path in (ROOT / "docs/images").glob("dashboard-*.png")
    }
    assert {"overview", "runs", "run", "run-graph", "queues", "workers"} <= taken
    assert shown == taken
    assert committed == taken

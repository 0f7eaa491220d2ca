"""The README's quickstart, run as a reader runs it: its spec and handlers are written into a new
project, its `pgflow-gen` and `python -m` commands run there on the project's own embedded
server, and every output line the README shows (an inline `# ...` comment, or `# ...` lines
after a command) is printed by that command. Run ids, worker ids and times may differ; `...`
stands for any text."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pgflow_gen.runtime import embedded

README = Path(__file__).resolve().parents[2] / "README.md"
QUICKSTART = README.read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
DEADLINE_S = 60.0


@dataclass
class Step:
    """A command of the quickstart and the lines the README says it prints."""

    command: str
    expected: list[str] = field(default_factory=list)

    @property
    def background(self) -> bool:
        return self.command.endswith("&")


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", QUICKSTART, re.DOTALL)


def file_block(name: str) -> str:
    """The code block right after the paragraph that names `name`."""
    after = QUICKSTART.split(f"`{name}`", 1)[1]
    return after.split("```", 2)[1].split("\n", 1)[1]


def steps() -> list[Step]:
    found: list[Step] = []
    for block in blocks("sh"):
        for line in block.splitlines():
            if line.startswith("# ") or line == "#":
                found[-1].expected.append(line[2:])
                continue
            command, _, comment = line.partition("  # ")
            if command.startswith(("pgflow-gen ", "python -m ")):
                found.append(Step(command.strip(), [comment.strip()] if comment else []))
    return found


def normalized(text: str) -> str:
    text = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<id>", text)
    return re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+", "<time>", text)


def shows(output: str, expected: str) -> bool:
    """Whether a line of `output` is `expected`, where `...` in it stands for any text."""
    parts = [re.escape(part.strip()) for part in normalized(expected).split("...")]
    pattern = re.compile("^" + ".*?".join(parts) + r"[ \t]*$", re.MULTILINE | re.DOTALL)
    return bool(pattern.search(normalized(output)))


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "hello"
    (root / "flows").mkdir(parents=True)
    (root / "app").mkdir()
    (root / "app" / "__init__.py").touch()
    (root / "flows" / "hello.yaml").write_text(file_block("flows/hello.yaml"))
    (root / "app" / "handlers.py").write_text(file_block("app/handlers.py"))
    yield root
    embedded.EmbeddedServer.for_project(root).destroy()


def test_the_readme_quickstart_prints_what_the_readme_shows(project: Path) -> None:
    quickstart = steps()
    assert [s.command.split()[:2] for s in quickstart if not s.background] == [
        ["pgflow-gen", "validate"],
        ["pgflow-gen", "build"],
        ["pgflow-gen", "db"],
        ["pgflow-gen", "start"],
        ["pgflow-gen", "coverage"],
    ]
    assert sum(s.background for s in quickstart) == 2
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "PATH": path, "PYTHONUNBUFFERED": "1"}
    for name in ("PGFLOW_DATABASE_URL", "DATABASE_URL"):
        env.pop(name, None)
    workers: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for index, step in enumerate(quickstart):
            if step.background:
                log = project / f"worker-{index}.log"
                with log.open("wb") as out:
                    process = subprocess.Popen(
                        shlex.split(step.command[:-1]), cwd=project, env=env, stdout=out,
                        stderr=subprocess.STDOUT,
                    )  # fmt: skip
                workers.append((process, log))
                _wait_for(log, " started (")  # as the README does: the first compiles the flow
                continue
            done = subprocess.run(
                shlex.split(step.command), cwd=project, env=env, capture_output=True, text=True,
                check=False, timeout=DEADLINE_S,
            )  # fmt: skip
            output = done.stdout + done.stderr
            assert done.returncode == 0, f"{step.command}:\n{output}"
            for line in step.expected:
                assert shows(output, line), f"{step.command} did not print {line!r}:\n{output}"
        logs = "".join(log.read_text() for _, log in workers)
        for step in quickstart:
            if step.background:
                for line in step.expected:
                    assert shows(logs, line), f"the workers did not log {line!r}:\n{logs}"
    finally:
        for process, _ in workers:
            process.send_signal(signal.SIGTERM)
        for process, _ in workers:
            assert process.wait(timeout=DEADLINE_S) == 0


def _wait_for(log: Path, text: str) -> None:
    end = time.monotonic() + DEADLINE_S
    while text not in log.read_text():
        assert time.monotonic() < end, f"{log.name} never logged {text!r}:\n{log.read_text()}"
        time.sleep(0.05)

"""The README's quickstart, run as a reader runs it, both ways: `pgflow-gen init` and the commands
after it, and by hand, with its spec and handlers written into a new project. Its `pgflow-gen`,
`pytest` and `python -m` commands run there on the project's own embedded server (a `cd` in a
command line moves into the folder), and every output line the README shows (an inline `# ...`
comment, or `# ...` lines after a command) is printed by that command. Run ids, worker ids and
times may differ; `...` stands for any text."""

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
WITH_INIT = QUICKSTART.split("### With `pgflow-gen init`", 1)[1].split("\n### ", 1)[0]
BY_HAND = QUICKSTART.split("### By hand", 1)[1]
COMMANDS = ("pgflow-gen ", "python -m ", "pytest ")
DEADLINE_S = 60.0


@dataclass
class Step:
    """A command of the quickstart and the lines the README says it prints."""

    command: str
    expected: list[str] = field(default_factory=list)

    @property
    def background(self) -> bool:
        return self.command.endswith("&")


def file_block(name: str) -> str:
    """The code block right after the paragraph that names `name`."""
    after = BY_HAND.split(f"`{name}`", 1)[1]
    return after.split("```", 2)[1].split("\n", 1)[1]


def steps(section: str) -> list[Step]:
    found: list[Step] = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.DOTALL):
        for line in block.splitlines():
            if line.startswith("# ") or line == "#":
                found[-1].expected.append(line[2:])
                continue
            command, _, comment = line.partition("  # ")
            if f"{command.strip()} ".startswith(COMMANDS):
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
    (root / "pyproject.toml").write_text(file_block("pyproject.toml"))
    (root / "flows" / "hello.yaml").write_text(file_block("flows/hello.yaml"))
    (root / "app" / "handlers.py").write_text(file_block("app/handlers.py"))
    yield root
    embedded.EmbeddedServer.for_project(root).destroy()


def test_the_quickstart_with_init_prints_what_the_readme_shows(tmp_path: Path) -> None:
    quickstart = steps(WITH_INIT)
    assert [s.command.split()[:2] for s in quickstart if not s.background] == [
        ["pgflow-gen", "init"],
        ["pgflow-gen", "build"],
        ["pytest", "-q"],
        ["pgflow-gen", "start"],
    ]
    assert [s.command for s in quickstart if s.background] == ["pgflow-gen dev &"]
    project = tmp_path / "my-flows"
    try:
        follow(quickstart, tmp_path)
        assert project.joinpath("app", "pgflow", "hello.py").is_file()
    finally:
        embedded.EmbeddedServer.for_project(project).destroy()


def test_the_quickstart_by_hand_prints_what_the_readme_shows(project: Path) -> None:
    quickstart = steps(BY_HAND)
    assert [s.command.split()[:2] for s in quickstart if not s.background] == [
        ["pgflow-gen", "validate"],
        ["pgflow-gen", "build"],
        ["pgflow-gen", "db"],
        ["pgflow-gen", "start"],
        ["pgflow-gen", "coverage"],
    ]
    assert sum(s.background for s in quickstart) == 2
    follow(quickstart, project)


def follow(quickstart: list[Step], cwd: Path) -> None:
    """Run the commands in order from `cwd`, the background ones as processes that are stopped
    (SIGTERM, exit 0) at the end, and check every line the README says they print."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "PATH": path, "PYTHONUNBUFFERED": "1"}
    for name in ("PGFLOW_DATABASE_URL", "DATABASE_URL", "PGFLOW_TEST_DATABASE_URL"):
        env.pop(name, None)
    workers: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for index, step in enumerate(quickstart):
            if step.background:
                log = cwd / f"background-{index}.log"
                with log.open("wb") as out:
                    process = subprocess.Popen(
                        shlex.split(step.command[:-1]), cwd=cwd, env=env, stdout=out,
                        stderr=subprocess.STDOUT,
                    )  # fmt: skip
                workers.append((process, log))
                _wait_for(log, " started (")  # as the README does: the first compiles the flow
                continue
            output = ""
            for part in step.command.split(" && "):
                if part.startswith("cd "):
                    cwd = cwd / part.removeprefix("cd ").strip()
                    continue
                done = subprocess.run(
                    shlex.split(part), cwd=cwd, env=env, capture_output=True, text=True,
                    check=False, timeout=DEADLINE_S,
                )  # fmt: skip
                output += done.stdout + done.stderr
                assert done.returncode == 0, f"{part}:\n{output}"
            for line in step.expected:
                assert shows(output, line), f"{step.command} did not print {line!r}:\n{output}"
        logs = "".join(log.read_text() for _, log in workers)
        for step in quickstart:
            if step.background:
                for line in step.expected:
                    assert shows(logs, line), f"{step.command} did not log {line!r}:\n{logs}"
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

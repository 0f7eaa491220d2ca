"""A small process supervisor for `pgflow-gen dev`: starts named commands (the Procfile's), prints
their output line by line behind a colored `name |` prefix, and stops them with SIGTERM (then
SIGKILL after a grace period).

Each child runs in its own session, so a Ctrl-C in the terminal reaches only `pgflow-gen dev`,
which then stops the children itself, in order, and waits for them.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TextIO

#: ANSI colors given to the processes in turn (a terminal only; NO_COLOR turns them off).
_COLORS = ("36", "33", "32", "35", "34", "31", "96", "93", "92", "95")
_RESET = "\033[0m"


@dataclass
class _Child:
    name: str
    popen: subprocess.Popen[bytes]
    reader: threading.Thread


class Supervisor:
    def __init__(
        self, *, cwd: str, env: Mapping[str, str], out: TextIO | None = None, color: bool = False
    ) -> None:
        self.cwd = cwd
        self.env = dict(env)
        self.out = out or sys.stdout
        self.color = color
        self.width = 6
        self._children: dict[str, _Child] = {}
        self._lock = threading.Lock()
        self._colors_used = 0

    @property
    def names(self) -> list[str]:
        return list(self._children)

    def say(self, text: str, name: str = "dev") -> None:
        """Print the supervisor's own lines behind its prefix."""
        for line in text.splitlines() or [""]:
            self._print(name, "1", line)

    def start(self, name: str, command: str) -> None:
        """Start `command` (a Procfile command line) as process `name`."""
        self.width = max(self.width, len(name))
        color = _COLORS[self._colors_used % len(_COLORS)]
        self._colors_used += 1
        argv = shlex.split(command)
        if argv and argv[0] in ("python", "python3"):
            argv[0] = sys.executable  # the Python that runs pgflow-gen, with the project's packages
        popen = subprocess.Popen(
            argv,
            cwd=self.cwd,
            env={**self.env, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        reader = threading.Thread(
            target=self._relay, args=(name, color, popen), name=f"relay-{name}", daemon=True
        )
        self._children[name] = _Child(name, popen, reader)
        self.say(f"started {name} (pid {popen.pid}): {command}")
        reader.start()

    def stop(self, name: str, grace: float) -> int | None:
        """Stop process `name` (SIGTERM, then SIGKILL after `grace` seconds); its exit status."""
        child = self._children.pop(name, None)
        if child is None:
            return None
        _terminate(child)
        return self._wait(child, time.monotonic() + grace)

    def stop_all(self, grace: float) -> dict[str, int | None]:
        """Stop every process: all get SIGTERM at once, then each is waited for."""
        children = list(self._children.values())
        self._children.clear()
        for child in children:
            _terminate(child)
        deadline = time.monotonic() + grace
        return {child.name: self._wait(child, deadline) for child in children}

    def _wait(self, child: _Child, deadline: float) -> int:
        try:
            child.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.say(f"{child.name} did not stop in time; killing it")
            child.popen.kill()
            child.popen.wait()
        child.reader.join(timeout=5)
        return child.popen.returncode

    def _relay(self, name: str, color: str, popen: subprocess.Popen[bytes]) -> None:
        assert popen.stdout is not None
        for raw in popen.stdout:
            self._print(name, color, raw.decode(errors="replace").rstrip("\r\n"))
        status = popen.wait()
        if name in self._children and self._children[name].popen is popen:
            self.say(f"{name} exited with status {status}; it starts again on the next change")

    def _print(self, name: str, color: str, text: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        prefix = f"{stamp} {name:<{self.width}} |"
        if self.color:
            prefix = f"\033[{color}m{prefix}{_RESET}"
        with self._lock:
            self.out.write(f"{prefix} {text}\n")
            self.out.flush()


def _terminate(child: _Child) -> None:
    if child.popen.poll() is None:
        child.popen.send_signal(signal.SIGTERM)


def use_color(stream: TextIO, environ: Mapping[str, str] = os.environ) -> bool:
    """Colors for a terminal, unless NO_COLOR is set (https://no-color.org)."""
    return stream.isatty() and not environ.get("NO_COLOR")

"""A small process supervisor for `pgflow-gen dev`: starts named commands (the Procfile's), prints
their output line by line behind a colored `name |` prefix, stops them with SIGTERM (then SIGKILL
after a grace period), restarts several at once, and starts one that crashed again after a
growing pause, as Procfile runners do.

Each child runs in its own session and process group, so a Ctrl-C in the terminal reaches only
`pgflow-gen dev`, which then stops the children itself; signals go to a child's whole group, so
a process a handler started (`sh -c 'sleep 41 & wait'`) stops with it and nothing is left behind.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TextIO

#: ANSI colors given to the processes in turn (a terminal only; NO_COLOR turns them off).
_COLORS = ("36", "33", "32", "35", "34", "31", "96", "93", "92", "95")
_RESET = "\033[0m"


#: A crashed process starts again after 1 s, then 2, 4, ... at most 30 s; the pause starts over
#: once it has run for CRASH_RESET_S.
FIRST_CRASH_PAUSE_S = 1.0
MAX_CRASH_PAUSE_S = 30.0
CRASH_RESET_S = 30.0


@dataclass
class _Child:
    name: str
    command: str
    popen: subprocess.Popen[bytes]
    reader: threading.Thread
    started_at: float
    #: Set when the supervisor stops it (so its exit is no crash), or stops everything.
    stopping: threading.Event


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
        # The output: reentrant, as a Ctrl-C while stopping prints from the signal handler.
        self._lock = threading.RLock()
        self._state = threading.RLock()  # the children (relay threads restart crashed ones)
        self._colors_used = 0
        self._colors: dict[str, str] = {}
        self._crash_pause: dict[str, float] = {}
        #: The processes `stop_all` waits for, and when it kills what is left of them.
        self._stopping: list[_Child] = []
        self._stop_deadline = 0.0

    @property
    def names(self) -> list[str]:
        with self._state:
            return list(self._children)

    def expect(self, names: Iterable[str]) -> None:
        """Make the prefix column wide enough for `names` (the Procfile's) before any of them
        starts, so that every line keeps one width."""
        self.width = max([self.width, *(len(name) for name in names)])

    def say(self, text: str, name: str = "dev") -> None:
        """Print the supervisor's own lines behind its prefix."""
        for line in text.splitlines() or [""]:
            self._print(name, "1", line)

    def start(self, name: str, command: str, env: Mapping[str, str] | None = None) -> None:
        """Start `command` (a Procfile command line) as process `name`, with `env` added to the
        supervisor's environment."""
        with self._state:
            self._start(name, command, env or {})

    def _start(self, name: str, command: str, env: Mapping[str, str]) -> None:
        self.width = max(self.width, len(name))
        if name not in self._colors:
            self._colors[name] = _COLORS[self._colors_used % len(_COLORS)]
            self._colors_used += 1
        color = self._colors[name]
        argv = shlex.split(command)
        if argv and argv[0] in ("python", "python3"):
            argv[0] = sys.executable  # the Python that runs pgflow-gen, with the project's packages
        popen = subprocess.Popen(
            argv,
            cwd=self.cwd,
            env={**self.env, **env, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        child = _Child(
            name, command, popen, threading.Thread(), time.monotonic(), threading.Event()
        )
        child.reader = threading.Thread(
            target=self._relay, args=(child, color, env), name=f"relay-{name}", daemon=True
        )
        self._children[name] = child
        self.say(f"started {name} (pid {popen.pid}): {command}")
        child.reader.start()

    def stop(self, name: str, grace: float) -> int | None:
        """Stop process `name` (SIGTERM, then SIGKILL after `grace` seconds); its exit status."""
        return self.stop_all(grace, [name]).get(name)

    def stop_all(self, grace: float, names: Iterable[str] | None = None) -> dict[str, int | None]:
        """Stop the named processes (default: every one): all get SIGTERM at once, then each is
        waited for."""
        with self._state:
            wanted = list(self._children) if names is None else list(names)
            children = [self._children.pop(n) for n in wanted if n in self._children]
            for child in children:
                child.stopping.set()
                _signal_group(child, signal.SIGTERM)
        deadline = time.monotonic() + grace
        self._stopping, self._stop_deadline = children, deadline
        try:
            return {child.name: self._wait(child, deadline) for child in children}
        finally:
            self._stopping = []

    def waiting_for(self) -> tuple[list[str], float]:
        """The processes `stop_all` still waits for (they finish what they run), and the
        seconds before it kills them; ([], 0) when it waits for none."""
        left = [child.name for child in self._stopping if child.popen.poll() is None]
        return left, max(0.0, self._stop_deadline - time.monotonic()) if left else 0.0

    def restart(
        self,
        names: Iterable[str],
        commands: Mapping[str, str],
        grace: float,
        cancel: threading.Event,
        env: Callable[[str], Mapping[str, str]] | None = None,
    ) -> bool:
        """Stop the named processes together and start each again with its command. Returns
        False at once, starting none, when `cancel` is set meanwhile (a Ctrl-C): the ones still
        stopping are then left to `stop_all`."""
        names = list(names)
        with self._state:
            children = [self._children[n] for n in names if n in self._children]
            for child in children:
                child.stopping.set()
                _signal_group(child, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(child.popen.poll() is None for child in children):
            if cancel.wait(0.05):
                return False
            if time.monotonic() > deadline:
                for child in children:
                    if child.popen.poll() is None:
                        self.say(f"{child.name} did not stop in time; killing it")
                        _signal_group(child, signal.SIGKILL)
        with self._state:
            for child in children:
                self._wait(child, deadline)
                if self._children.get(child.name) is child:
                    del self._children[child.name]
            if cancel.is_set():
                return False
            for name in names:
                if name not in self._children:
                    self._start(name, commands[name], env(name) if env else {})
        return True

    def _wait(self, child: _Child, deadline: float) -> int:
        try:
            child.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.say(f"{child.name} did not stop in time; killing it")
            _signal_group(child, signal.SIGKILL)
            child.popen.wait()
        _signal_group(child, signal.SIGKILL)  # whatever it started and left behind
        child.reader.join(timeout=5)
        return child.popen.returncode

    def _relay(self, child: _Child, color: str, env: Mapping[str, str]) -> None:
        popen = child.popen
        assert popen.stdout is not None
        with popen.stdout:  # closed at its end: no pipe left open per restart
            for raw in popen.stdout:
                self._print(child.name, color, raw.decode(errors="replace").rstrip("\r\n"))
        status = popen.wait()
        if child.stopping.is_set():
            return
        # A crash: start it again after a pause that grows while it keeps crashing.
        ran = time.monotonic() - child.started_at
        pause = (
            FIRST_CRASH_PAUSE_S
            if ran >= CRASH_RESET_S
            else self._crash_pause.get(child.name, FIRST_CRASH_PAUSE_S)
        )
        self._crash_pause[child.name] = min(pause * 2, MAX_CRASH_PAUSE_S)
        self.say(f"{child.name} exited with status {status}; starting it again in {pause:g} s")
        if child.stopping.wait(pause):
            return  # stopped meanwhile
        _signal_group(child, signal.SIGKILL)  # what the crashed process left behind
        with self._state:
            if self._children.get(child.name) is child and not child.stopping.is_set():
                self._start(child.name, child.command, env)

    def _print(self, name: str, color: str, text: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        prefix = f"{stamp} {name:<{self.width}} |"
        if self.color:
            prefix = f"\033[{color}m{prefix}{_RESET}"
        with self._lock:
            self.out.write(f"{prefix} {text}\n")
            self.out.flush()


def _signal_group(child: _Child, number: int) -> None:
    """Signal the child's process group (its pid: it leads its own session), if any is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.popen.pid, number)


def use_color(stream: TextIO, environ: Mapping[str, str] = os.environ) -> bool:
    """Colors for a terminal, unless NO_COLOR is set (https://no-color.org)."""
    return stream.isatty() and not environ.get("NO_COLOR")

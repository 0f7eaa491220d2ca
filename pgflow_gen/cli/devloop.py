"""`pgflow-gen dev`: the local loop in one command.

It builds the specs of `[tool.pgflow-gen]`, starts or reuses the database (the embedded one
unless a URL is configured), applies the engine migrations, and runs every worker of the
generated Procfile as a child process (see `supervisor`). Then it watches the project:

- a spec changed: rebuild; workers whose generated flow module or entry file changed restart,
  new ones start, removed ones stop (each worker compiles its flow when it starts: on a local
  database a changed flow is recompiled, as always). A spec error is printed as `validate` prints
  it, and the running workers keep running;
- a Python file changed: the workers that imported it restart, together; each worker tells
  which files it imported when it started (`PGFLOW_DEV_IMPORTS`, written by `start_worker`), so a
  test or a script no worker imports restarts none (a worker that has not told yet restarts).

A worker that crashes starts again after a pause (1 s, doubling up to 30 s while it keeps
crashing). Ctrl-C (or SIGTERM) stops every worker (they drain), also in the middle of a restart,
and ends with status 0.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import psycopg
import watchfiles

from pgflow_gen import naming
from pgflow_gen.cli import project as project_module
from pgflow_gen.cli import supervisor as supervisor_module
from pgflow_gen.codegen import artifacts
from pgflow_gen.codegen import build as build_module
from pgflow_gen.errors import UsageError
from pgflow_gen.runtime import database, migrations
from pgflow_gen.runtime.worker import process as worker_module
from pgflow_gen.spec import problems as problems_module
from pgflow_gen.words import counted

#: How long stopping workers may drain before they are killed.
STOP_GRACE_S = 10.0
#: The drain `dev` starts its workers with (PGFLOW_SHUTDOWN_GRACE, unless set already): within
#: STOP_GRACE_S, so a worker says how long it drains truly and gives up before it is killed.
WORKER_GRACE_S = 8.0
#: Folders never watched.
_IGNORED_DIRS = {".git", ".venv", "venv", ".pgflow", "__pycache__", ".mypy_cache",
                 ".pytest_cache", ".ruff_cache", "node_modules"}  # fmt: skip


@dataclass(frozen=True)
class Plan:
    """What the generated output asks to run: Procfile entries, what each one depends on."""

    #: Procfile name -> command.
    commands: dict[str, str] = field(default_factory=dict)
    #: Procfile name -> a hash of its generated flow module and entry file.
    fingerprints: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Settings:
    project: Path
    specs: tuple[Path, ...]
    out: Path
    package: str | None

    @classmethod
    def of(cls, project: Path) -> Settings:
        config = project_module.config(project)
        if not config.get("specs") or "out" not in config:
            raise UsageError(
                "pgflow-gen dev needs `specs` and `out` under [tool.pgflow-gen] in pyproject.toml.",
                hint="Run it in a project folder, for example one made by `pgflow-gen init`.",
            )
        return cls(
            project=project,
            specs=tuple(project / p for p in config["specs"]),
            out=project / config["out"],
            package=config.get("package"),
        )

    def spec_files(self) -> list[Path]:
        return project_module.spec_files(self.specs)


class DevLoop:
    def __init__(
        self, settings: Settings, database_url: str | None, out: TextIO | None = None
    ) -> None:
        self.settings = settings
        self.database_url = database_url
        self.out = out or sys.stdout
        self.stopping = threading.Event()
        self.plan = Plan()
        #: Where each worker writes the files it imported (see start_worker).
        self.imports = Path(tempfile.mkdtemp(prefix="pgflow-dev-imports-"))
        self.supervisor = supervisor_module.Supervisor(
            cwd=str(settings.project),
            env=os.environ,
            out=self.out,
            color=supervisor_module.use_color(self.out),
        )

    def run(self) -> int:
        plan = self._build()
        url = database.resolve_url(self.database_url, project=self.settings.project)
        self._say(f"database {database.redact(url)}")
        with psycopg.connect(url, autocommit=True) as conn:
            migrations.ensure_pgmq(conn)
            applied = migrations.migrate(conn)
        self._say(f"engine migrations: {len(applied)} applied" if applied else "engine is current")
        self.supervisor.env["PGFLOW_DATABASE_URL"] = url
        self.supervisor.env.pop("DATABASE_URL", None)
        # Ctrl-C and SIGTERM only ask the loop to stop (even where SIGINT was inherited as
        # ignored, as by a background job of a shell): a restart under way stops starting
        # workers, and every worker is stopped on the way out.
        previous = {
            number: signal.signal(number, lambda *_: self.stopping.set())
            for number in (signal.SIGINT, signal.SIGTERM)
        }
        try:  # from the first worker on: whatever happens, every one is stopped
            if plan is not None:
                self._apply(plan)
            self._say("watching for changes; Ctrl-C stops every worker")
            for changes in self._watch():
                self._changed({Path(path) for _, path in changes})
        finally:
            # Ctrl-C again while the workers drain says what it waits for, and how long.
            for number in (signal.SIGINT, signal.SIGTERM):
                signal.signal(number, lambda *_: self._say(self.stopping_words()))
            try:
                statuses = self.supervisor.stop_all(STOP_GRACE_S)
            finally:
                for number, handler in previous.items():
                    signal.signal(number, handler)
            summary = ", ".join(f"{name} {status}" for name, status in sorted(statuses.items()))
            self._say(f"stopped ({summary or 'no workers'})")
            shutil.rmtree(self.imports, ignore_errors=True)
        return 0

    # -- changes -------------------------------------------------------------------------------
    def _watch(self) -> Iterator[Set[tuple[watchfiles.Change, str]]]:
        return watchfiles.watch(
            self.settings.project,
            *[p for p in self.settings.specs if p.exists() and not self._in_project(p)],
            watch_filter=self._watched,
            stop_event=self.stopping,
            debounce=400,
            raise_interrupt=False,
        )

    def _watched(self, change: watchfiles.Change, path: str) -> bool:
        candidate = Path(path)
        if _IGNORED_DIRS.intersection(candidate.parts) or _inside(candidate, self.settings.out):
            return False
        return candidate.suffix in (".py", ".yaml", ".yml")

    def _changed(self, paths: set[Path]) -> None:
        specs = [p for p in paths if p.suffix in (".yaml", ".yml") and self._is_spec(p)]
        sources = {p for p in paths if p.suffix == ".py"}
        if specs:
            self._say(f"spec changed: {', '.join(sorted(self._show(p) for p in specs))}")
            plan = self._build()
            if plan is not None:
                self._apply(plan)
        if sources and not self.stopping.is_set():
            modules = sorted({m for m in map(self._module_of, sources) if m})
            restart = self._affected(sources)
            if restart:
                self._say(f"changed: {', '.join(modules)}")
                self._restart(sorted(restart))
            else:
                self._say(f"changed: {', '.join(modules)} (no worker imports it: none restarts)")

    def _affected(self, sources: set[Path]) -> set[str]:
        """The workers that imported any of `sources` when they started, and those that have
        not said yet what they imported."""
        changed = {str(p.resolve()) for p in sources}
        affected = set()
        for name in self.supervisor.names:
            try:
                imported = set(json.loads((self.imports / f"{name}.json").read_text()))
            except (OSError, ValueError):
                affected.add(name)  # still starting (or it crashed before it said)
                continue
            if imported & changed:
                affected.add(name)
        return affected

    # -- building and applying a plan ------------------------------------------------------------
    def _build(self) -> Plan | None:
        settings = self.settings
        files = settings.spec_files()
        try:
            build_module.load(files, project=settings.project)
            package = settings.package or build_module.package_for(settings.out, settings.project)
            generated = build_module.generate(files, package=package, project=settings.project)
        except problems_module.SpecErrors as exc:
            for problem in exc.problems:
                self._say(problem.render())
            self._say(f"{counted(len(exc.problems), 'problem')}: the running workers keep running")
            return None
        except naming.FlowSpecError as exc:
            self._say(f"error: {exc}: the running workers keep running")
            return None
        outcome = build_module.apply(generated, settings.out, check=False)
        plan = _plan(generated)
        self.supervisor.expect(plan.commands)  # the prefix's width, before its first line
        self._say(
            f"built {counted(len(files), 'spec')}: {len(outcome.written)} written,"
            f" {len(outcome.removed)} removed, {outcome.unchanged} unchanged"
        )
        return plan

    def _apply(self, plan: Plan) -> None:
        """Stop removed workers, restart changed ones, start new ones."""
        old, self.plan = self.plan, plan
        self.supervisor.expect(plan.commands)
        self.supervisor.stop_all(STOP_GRACE_S, [n for n in old.commands if n not in plan.commands])
        changed = [
            name
            for name, command in plan.commands.items()
            if name in old.commands
            and (command, plan.fingerprints[name]) != (old.commands[name], old.fingerprints[name])
        ]
        self._restart(changed)
        for name, command in plan.commands.items():
            if name not in old.commands and not self.stopping.is_set():
                self._start(name, command)

    def _restart(self, names: list[str]) -> None:
        """Restart `names` together (a Ctrl-C meanwhile stops the wave)."""
        for name in names:
            (self.imports / f"{name}.json").unlink(missing_ok=True)
        self.supervisor.restart(
            names, self.plan.commands, STOP_GRACE_S, self.stopping, env=self._worker_env
        )

    def _start(self, name: str, command: str) -> None:
        (self.imports / f"{name}.json").unlink(missing_ok=True)
        self.supervisor.start(name, command, self._worker_env(name))

    def _worker_env(self, name: str) -> dict[str, str]:
        env = {worker_module.DEV_IMPORTS_VARIABLE: str(self.imports / f"{name}.json")}
        if "PGFLOW_SHUTDOWN_GRACE" not in os.environ:
            env["PGFLOW_SHUTDOWN_GRACE"] = f"{WORKER_GRACE_S:g}"
        return env

    # -- helpers ---------------------------------------------------------------------------------
    def _in_project(self, path: Path) -> bool:
        return _inside(path, self.settings.project)

    def _is_spec(self, path: Path) -> bool:
        return any(path == spec or _inside(path, spec) for spec in self.settings.specs)

    def _module_of(self, path: Path) -> str | None:
        try:
            relative = path.resolve().relative_to(self.settings.project.resolve())
        except ValueError:
            return None
        parts = list(relative.with_suffix("").parts)
        if parts and parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts) or None

    def _show(self, path: Path) -> str:
        return build_module.display_path(path, self.settings.project)

    def stopping_words(self) -> str:
        """What stopping waits for: "still stopping: waiting for hello-greet (its handlers
        finish; killed in 7 s)"."""
        names, left = self.supervisor.waiting_for()
        if not names:
            return "still stopping"
        return (
            f"still stopping: waiting for {', '.join(names)} (its handlers finish; killed in"
            f" {left:.0f} s)"
        )

    def _say(self, text: str) -> None:
        self.supervisor.say(text)


def _plan(generated: dict[str, str]) -> Plan:
    commands = project_module.procfile_commands(generated.get(artifacts.PROCFILE, ""))
    fingerprints = {}
    for name, command in commands.items():
        module = command.rsplit(" ", 1)[-1]  # package.workers.<flow module>.<entry>
        flow_module, entry = module.split(".")[-2:]
        digest = hashlib.sha256()
        for path in (f"{flow_module}.py", f"workers/{flow_module}/{entry}.py"):
            digest.update(generated.get(path, "").encode())
        fingerprints[name] = digest.hexdigest()
    return Plan(commands=commands, fingerprints=fingerprints)


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
    except ValueError:
        return False
    return True

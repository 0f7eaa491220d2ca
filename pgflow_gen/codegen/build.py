"""`pgflow-gen build`: generate every artifact in memory, then write only what changed.

The manifest lists every generated file with its hash, so a later build (or `--check`) knows
which files are orphans; files the manifest does not list are never touched, and nothing outside
the output folder is ever written or removed.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from pgflow_gen import naming
from pgflow_gen.codegen import artifacts, checks, subflows, views
from pgflow_gen.errors import UsageError
from pgflow_gen.spec import loader
from pgflow_gen.spec.problems import Problem, SpecErrors


@dataclass
class Outcome:
    """What a build changed (or, with --check, would change)."""

    written: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: int = 0
    diffs: list[str] = field(default_factory=list)

    @property
    def stale(self) -> bool:
        return bool(self.written or self.removed)


def package_for(out: Path, project: Path) -> str:
    """`app/pgflow` (relative to the project) -> `app.pgflow`."""
    try:
        relative = out.resolve().relative_to(project.resolve())
    except ValueError as exc:
        raise naming.FlowSpecError(
            f"Cannot derive a Python package from {out}: it is outside the project.",
            hint="Pass --package explicitly.",
        ) from exc
    parts = relative.parts
    if not parts or not all(part.isidentifier() for part in parts):
        raise naming.FlowSpecError(
            f'"{relative}" is not a Python package path.', hint="Pass --package explicitly."
        )
    return ".".join(parts)


class UnsafeOutputPathError(UsageError):
    """A path the build would write or remove leads outside the output folder."""

    code = "unsafe_output_path"


def display_path(path: Path, project: Path) -> str:
    """`path` relative to the project, with `..` when it lies outside: never absolute, so the
    generated headers do not depend on where the checkout is."""
    return Path(os.path.relpath(path.resolve(), project.resolve())).as_posix()


def load(spec_paths: Sequence[Path], *, project: Path) -> list[checks.LoadedSpec]:
    """Load every spec and check what the generator needs across them; raise SpecErrors with
    every problem of every file. `pgflow-gen validate` runs exactly this."""
    problems: list[Problem] = []
    loaded = []
    for path in spec_paths:
        source = display_path(path, project)
        try:
            loaded.append(
                checks.LoadedSpec(path, source, loader.load_file(path, display_name=source))
            )
        except SpecErrors as exc:
            problems.extend(exc.problems)
    problems += checks.problems(loaded)
    if not problems:  # across the flows: each must be valid on its own first
        problems += subflows.problems(loaded)
    if problems:
        raise SpecErrors(problems)
    return loaded


def generate(spec_paths: Sequence[Path], *, package: str, project: Path) -> dict[str, str]:
    """Every generated file, keyed by its path relative to the output directory."""
    return generate_loaded(load(spec_paths, project=project), package=package)


def unfound_handler_modules(loaded: Sequence[checks.LoadedSpec], project: Path) -> list[str]:
    """A warning for each step whose handler module no file of the project provides (nor of
    its `src/`), and no installed package: most likely a typo, which the worker would meet only
    when it starts. A warning, since a handler may live on another path at run time."""
    warnings = []
    for item in loaded:
        for index, step in enumerate(item.spec.steps):
            if step.handler is None:  # a signal or subflow step
                continue
            module = step.handler.partition(":")[0]
            if _module_found(module, project):
                continue
            where = item.locator.at(("steps", index, "handler"))
            warnings.append(
                f'{where}: warning: the handler module "{module}" of step "{step.slug}" is not'
                f" found under {project} (nor its src/): check `handler:`, or ignore this when"
                " the module is installed or on the workers' PYTHONPATH"
            )
    return warnings


def _module_found(module: str, project: Path) -> bool:
    parts = module.split(".")
    for base in (project, project / "src"):
        path = base.joinpath(*parts)
        if path.with_suffix(".py").is_file() or path.is_dir():
            return True
    if (project / parts[0]).exists() or (project / "src" / parts[0]).exists():
        return False  # the project's own package, without that module
    # Another package: installed? (A top-level lookup imports nothing.)
    return importlib.util.find_spec(parts[0]) is not None


def generate_loaded(loaded: Sequence[checks.LoadedSpec], *, package: str) -> dict[str, str]:
    """`generate` for specs already loaded (and checked) by `load`."""
    flows = [views.build(item.spec, source=item.source, package=package) for item in loaded]
    sources = _common_source([item.source for item in loaded])
    files: dict[str, str] = {}
    for flow in flows:
        files.update(artifacts.flow_module(flow))
        files.update(artifacts.worker_entries(flow))
        files.update(artifacts.migration(flow))
    files.update(artifacts.procfile(flows, sources))
    files.update(artifacts.packages(sources))
    files[artifacts.MANIFEST] = _manifest(files, sources)
    return dict(sorted(files.items()))


def apply(files: dict[str, str], out: Path, *, check: bool) -> Outcome:
    """Write changed files and remove orphans (or, with `check`, only describe them as diffs).

    Every path is checked to stay inside `out` before anything is written or removed.
    """
    outcome = Outcome()
    previous = _previous_manifest(out)
    orphans = sorted(set(previous) - set(files))
    for relative in files:
        _check_inside(out, relative, origin="The build writes")
    for relative in orphans:
        _check_inside(out, relative, origin=f"{out / artifacts.MANIFEST} lists")
    to_write: list[tuple[Path, str]] = []
    for relative, content in files.items():
        target = out / relative
        current = target.read_text(encoding="utf-8") if target.is_file() else None
        if current == content:
            outcome.unchanged += 1
            continue
        outcome.written.append(relative)
        if check:
            outcome.diffs.append(_diff(relative, current, content))
        else:
            to_write.append((target, content))
    for relative in orphans:
        target = out / relative
        if target.is_file():
            outcome.removed.append(relative)
            if check:
                outcome.diffs.append(_diff(relative, target.read_text(encoding="utf-8"), None))
            else:
                target.unlink()
    _write_all(to_write)
    return outcome


def _check_inside(out: Path, relative: str, *, origin: str) -> None:
    """Raise UnsafeOutputPathError unless `out / relative` stays inside `out`: a relative path
    without `..`, and no symlink on the way that leads out."""
    escapes = (
        not relative
        or "\\" in relative
        or PurePosixPath(relative).is_absolute()
        or any(part in ("..", "") for part in relative.split("/"))
    )
    root = out.resolve()
    if not escapes:
        escapes = not (out / relative).resolve().is_relative_to(root)
    if escapes:
        raise UnsafeOutputPathError(
            f'{origin} "{relative}", which leads outside {out}; nothing was written or removed.',
            detail="Generated files are written and removed only inside the output folder"
            " (no absolute path, no `..`, no symlink that leads out).",
            hint="Remove the entry from the manifest (or the symlink from the output folder),"
            " then build again.",
        )


def _write_all(files: list[tuple[Path, str]]) -> None:
    for folder in sorted({path.parent for path, _ in files}):
        folder.mkdir(parents=True, exist_ok=True)
    for path, content in files:
        path.write_text(content, encoding="utf-8", newline="\n")


def _manifest(files: dict[str, str], sources: str) -> str:
    listing = {
        path: hashlib.sha256(content.encode()).hexdigest()
        for path, content in sorted(files.items())
    }
    document = {
        "comment": f"Code generated by pgflow-gen from {sources}. DO NOT EDIT.",
        "files": listing,
    }
    return json.dumps(document, indent=2) + "\n"


def _previous_manifest(out: Path) -> dict[str, str]:
    path = out / artifacts.MANIFEST
    try:
        files = json.loads(path.read_text(encoding="utf-8")).get("files", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return {str(k): str(v) for k, v in files.items()} if isinstance(files, dict) else {}


def _common_source(sources: list[str]) -> str:
    """The folders of the specs (`flows`); a spec at the project root is named by its file."""
    names = {
        source
        if PurePosixPath(source).parent == PurePosixPath(".")
        else str(PurePosixPath(source).parent)
        for source in sources
    }
    return ", ".join(sorted(names)) if names else "no specs"


def _diff(relative: str, before: str | None, after: str | None) -> str:
    return "".join(
        difflib.unified_diff(
            [] if before is None else before.splitlines(keepends=True),
            [] if after is None else after.splitlines(keepends=True),
            fromfile=f"a/{relative}" if before is not None else "/dev/null",
            tofile=f"b/{relative}" if after is not None else "/dev/null",
        )
    )

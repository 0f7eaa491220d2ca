"""`pgflow-gen validate --check-handlers`: does each step's handler import, from the project, as
its worker will import it? A handler path that names no function (`app.handlers:price_line` for
`price_lines`) passes the spec's own checks and only fails when the worker starts, in a loop;
here it is a located problem with the near match. This imports the handler modules, so it runs
their top-level code, and every module it imported is forgotten afterwards.

`pgflow-gen build` asks too, after it wrote the generated code, but only about modules that
import cleanly (`cleanly_imported_only`): a handler module not written yet, or one that needs
what a build cannot give it, is left to `validate --check-handlers` and the worker.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from pgflow_gen.codegen import checks
from pgflow_gen.spec.problems import Problem


def unimportable(
    loaded: Sequence[checks.LoadedSpec], project: Path, *, cleanly_imported_only: bool = False
) -> list[Problem]:
    """A problem for each step whose handler does not import from `project` (or its `src/`);
    with `cleanly_imported_only`, only for handlers whose module imports but lacks them."""
    found = []
    with _importing_from(project):
        for item in loaded:
            for index, step in enumerate(item.spec.steps):
                if step.handler is None:  # a signal step
                    continue
                why = _why_not(step.handler)
                if why is None or (cleanly_imported_only and not why.module_imported):
                    continue
                reason, hint = why.reason, why.hint
                found.append(
                    Problem(
                        "handler_not_importable",
                        f'The handler "{step.handler}" of step "{step.slug}" does not import:'
                        f" {reason}.",
                        item.locator.at(("steps", index, "handler")),
                        hint=hint,
                        flow_slug=item.spec.slug,
                        step_slug=step.slug,
                        step_index=index,
                    )
                )
    return found


@dataclass(frozen=True)
class _Why:
    reason: str
    hint: str | None
    module_imported: bool  # the module imported cleanly; the function is what is wrong


def _why_not(handler: str) -> _Why | None:
    """Why `handler` ("module:function") does not import, and a hint; None when it does."""
    module_name, _, attribute = handler.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return _Why(f"no module named {module_name!r}", "Check the module path of `handler:`.",
                        module_imported=False)  # fmt: skip
        return _Why(
            f"{type(exc).__name__}: {exc}",
            f"The module imports {exc.name!r}, which is missing: if that is the generated"
            " code, run `pgflow-gen build` first.",
            module_imported=False,
        )
    except (Exception, SystemExit) as exc:  # its own code failed: say how, as the worker would
        return _Why(f"{type(exc).__name__}: {exc}", None, module_imported=False)
    target: object = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            return _Why(f"{module_name!r} has no attribute {part!r}", _near(part, target),
                        module_imported=True)  # fmt: skip
        target = getattr(target, part)
    if not callable(target):
        return _Why(f"{attribute!r} is a {type(target).__name__}, not a function", None,
                    module_imported=True)  # fmt: skip
    return None


def _near(name: str, holder: object) -> str:
    names = [n for n in dir(holder) if not n.startswith("_") and callable(getattr(holder, n))]
    near = difflib.get_close_matches(name, names, n=1)
    if near:
        return f'Did you mean "{near[0]}"? Handler names are exact.'
    return "Name a function the module defines."


@contextlib.contextmanager
def _importing_from(project: Path) -> Iterator[None]:
    """Imports resolve from the project (and its `src/`) first; every module imported meanwhile
    is forgotten afterwards, so a later import sees the files as they are then."""
    before: dict[str, ModuleType] = dict(sys.modules)
    path = list(sys.path)
    sys.path[:0] = [str(project), str(project / "src")]
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path[:] = path
        for name in set(sys.modules) - set(before):
            del sys.modules[name]

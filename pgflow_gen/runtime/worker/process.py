"""Starting a worker process: `start_worker`, called once per process by a generated entry file.

A plain flow is served by one worker for all its steps (`handlers`); a step-queued flow needs one
worker per step (`step_slug` from the flow's Literal union, and that step's `handler`). Both are
checked here, before anything connects; then the worker compiles or verifies the flow, registers
with its exact queue and polls until SIGTERM/SIGINT or deprecation (see `loop`).
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import json
import logging
import os
import pkgutil
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, overload

from typing_extensions import Unpack

from pgflow_gen import naming
from pgflow_gen.runtime import database, errors
from pgflow_gen.runtime.flow import Flow, StepQueuedFlow
from pgflow_gen.runtime.worker import settings as worker_config
from pgflow_gen.runtime.worker.assignment import not_retried
from pgflow_gen.runtime.worker.loop import HANDLER_THREAD_PREFIX, Assignment, WorkerLoop
from pgflow_gen.runtime.worker.settings import SettingKeywords, WorkerSettings

StepSlugT = TypeVar("StepSlugT", bound=str)
InputT = TypeVar("InputT")
OutputT = TypeVar("OutputT")

Handler = Callable[..., Any]

#: Set by `pgflow-gen dev`: the file a starting worker writes the paths of its imported modules
#: to (JSON), so that dev restarts only the workers a changed file affects.
DEV_IMPORTS_VARIABLE = "PGFLOW_DEV_IMPORTS"

_started = threading.Lock()
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
log = logging.getLogger("pgflow_gen.worker")


@overload
def start_worker(
    flow: StepQueuedFlow[StepSlugT, InputT, OutputT],
    *,
    step_slug: StepSlugT,
    handler: Handler,
    database_url: str | None = None,
    settings: WorkerSettings | None = None,
    argv: Sequence[str] | None = None,
    **keywords: Unpack[SettingKeywords],
) -> None: ...


@overload
def start_worker(
    flow: Flow[StepSlugT, InputT, OutputT],
    *,
    # The generated `Handlers` TypedDict (one typed handler per step) is what callers pass.
    handlers: Mapping[str, object],
    database_url: str | None = None,
    settings: WorkerSettings | None = None,
    argv: Sequence[str] | None = None,
    **keywords: Unpack[SettingKeywords],
) -> None: ...


def start_worker(
    flow: Flow[Any, Any, Any] | StepQueuedFlow[Any, Any, Any],
    *,
    step_slug: str | None = None,
    handler: Handler | None = None,
    handlers: Mapping[str, object] | None = None,
    database_url: str | None = None,
    settings: WorkerSettings | None = None,
    argv: Sequence[str] | None = None,
    **keywords: Unpack[SettingKeywords],
) -> None:
    """Run a worker until it is stopped (SIGTERM/SIGINT) or deprecated.

    Settings are a `WorkerSettings` (`settings`) and its fields as keywords (`max_concurrent=4`),
    which win over it; `PGFLOW_*` environment variables win over both and, when `argv` is given
    (generated entry files pass their command line), `--flags` over those. A configuration or
    startup problem raises a typed error (a subclass of `PgflowError`): `ConfigError` for a wrong
    step slug, handler or setting (checked before anything connects), `DatabaseError` for an
    unreachable database or a missing engine, `FlowShapeMismatchError` /
    `FlowRoutingMismatchError` for a flow that differs from its definition. A generated entry
    file runs this through `run_main`, which turns them into one logged error and exit status 1.
    """
    with _signals_noted() as stopped_before:
        _configure_logging()
        _run(flow, step_slug, handler, handlers, database_url, argv, stopped_before,
             settings, keywords)  # fmt: skip


@contextlib.contextmanager
def _signals_noted() -> Iterator[list[str]]:
    """Note SIGTERM/SIGINT while the worker starts, so a process manager stopping a worker that
    is still starting gets a clean stop (exit 0) instead of a process killed by the signal.

    The worker's event loop takes the signals over once it runs; the names noted before that
    are handed to it. Outside the main thread signals cannot be handled here, and nothing changes.
    """
    noted: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return

    def note(number: int, _frame: object) -> None:
        noted.append(signal.Signals(number).name)

    previous = {number: signal.signal(number, note) for number in _STOP_SIGNALS}
    try:
        yield noted
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def run_main(main: Callable[[], None]) -> int:
    """Run a process's `main` (which calls `start_worker`) and return its exit status: 0, or 1
    after logging a `PgflowError` as one line (`ConfigError: ...`), without a traceback.

    Generated entry files end with `sys.exit(run_main(main))`; code that embeds a worker calls
    `start_worker` directly and catches the typed errors itself.
    """
    try:
        main()
    except errors.PgflowError as exc:
        _configure_logging()
        log.error("%s: %s", type(exc).__name__, exc)
        return 1
    if _abandoned_handler_threads():
        # Handlers still running after the grace period cannot be stopped, and the interpreter
        # would wait for them at exit: their tasks are left to stall recovery, so leave now.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def handler_import_failed(
    handlers: Mapping[str, str], source: str, exc: ImportError | AttributeError
) -> int:
    """What a generated entry file does when its handlers do not import (a typo in the spec's
    `handler:` or in the module): log one line naming the handler, the spec and Python's own
    message with a suggestion, and return exit status 1. `handlers` maps each step to its
    handler path (`app.handlers:greeting`) as the spec `source` names it."""
    _configure_logging()
    error = handler_import_error(handlers, source, exc)
    log.error("%s: %s", type(error).__name__, error)
    return 1


def handler_import_error(
    handlers: Mapping[str, str], source: str, exc: ImportError | AttributeError
) -> errors.ConfigError:
    """The ConfigError for handlers that do not import (see `handler_import_failed`)."""
    reason = traceback.format_exception_only(exc)[-1].strip()
    suggestion = _suggestion(exc)
    if suggestion and "Did you mean" not in reason:
        reason += f". Did you mean: {suggestion!r}?"
    culprits = [(step, path) for step, path in handlers.items() if _names_the_failure(path, exc)]
    if culprits:
        step, path = culprits[0]
        what = f'The handler "{path}" of step "{step}" ({source}) does'
    else:  # something the handler's module imports
        what = f"The handlers ({source}) do"
    return errors.ConfigError(
        f"{what} not import: {reason}",
        hint=f"Fix `handler:` in {source} (or the module) and run `pgflow-gen build`; run the"
        " worker from the folder that holds the handler's package.",
    )


def _names_the_failure(path: str, exc: ImportError | AttributeError) -> bool:
    module, _, function = path.partition(":")
    if isinstance(exc, AttributeError):
        owner = getattr(getattr(exc, "obj", None), "__name__", None)
        return owner == module and getattr(exc, "name", None) == function
    missing = exc.name or ""
    return bool(missing) and (module == missing or module.startswith(missing + "."))


def _suggestion(exc: ImportError | AttributeError) -> str | None:
    """A near name for a missing attribute or module, as Python suggests for a missing name."""
    name = getattr(exc, "name", None) or ""
    if isinstance(exc, AttributeError):
        candidates = [n for n in dir(getattr(exc, "obj", None)) if not n.startswith("_")]
        near = difflib.get_close_matches(name, candidates, n=1)
        return near[0] if near else None
    parent, _, leaf = name.rpartition(".")
    package = sys.modules.get(parent) if parent else None
    if parent and package is None:
        return None
    where = getattr(package, "__path__", None) if package is not None else None
    found = [module.name for module in pkgutil.iter_modules(where)]
    near = difflib.get_close_matches(leaf, found, n=1)
    return (f"{parent}.{near[0]}" if parent else near[0]) if near else None


def _abandoned_handler_threads() -> bool:
    for thread in threading.enumerate():
        if thread.name.startswith(HANDLER_THREAD_PREFIX):
            thread.join(timeout=0.1)  # an idle pool thread ends at once after shutdown
            if thread.is_alive():
                return True
    return False


def _run(
    flow: Flow[Any, Any, Any] | StepQueuedFlow[Any, Any, Any],
    step_slug: str | None,
    handler: Handler | None,
    handlers: Mapping[str, object] | None,
    database_url: str | None,
    argv: Sequence[str] | None,
    stopped_before: Sequence[str],
    base: WorkerSettings | None,
    keywords: Mapping[str, Any],
) -> None:
    assignment = assignment_for(flow, step_slug=step_slug, handler=handler, handlers=handlers)
    overrides = worker_config.overrides(
        argv or (), os.environ, serves=assignment.describe(), prog=_entry_command()
    )
    url_override = overrides.pop("database_url", None)
    settings = worker_config.settings(base, keywords, overrides)
    if not _started.acquire(blocking=False):
        raise errors.ConfigError(
            "start_worker was already called in this process.",
            hint="Run one worker per process: one entry file (see the Procfile) per process.",
        )
    try:
        url = database.resolve_url(url_override or database_url)
        database.check_url(url)
        _report_imports(os.environ.get(DEV_IMPORTS_VARIABLE))
        worker = WorkerLoop(assignment, settings, url, log)
        asyncio.run(worker.run(stopped_before))
    finally:
        _started.release()


def _report_imports(path: str | None) -> None:
    """Write the files of every module imported so far to `path` (for `pgflow-gen dev`)."""
    if not path:
        return
    files = sorted(
        {
            os.path.realpath(file)
            for module in list(sys.modules.values())
            if isinstance(file := getattr(module, "__file__", None), str)
        }
    )
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as out:
            json.dump(files, out)
        os.replace(path + ".tmp", path)  # whole or not at all: dev may read it any time
    except OSError as exc:
        log.warning("could not write the imported modules to %s: %s", path, exc)


def assignment_for(
    flow: Flow[Any, Any, Any] | StepQueuedFlow[Any, Any, Any],
    *,
    step_slug: str | None,
    handler: Handler | None,
    handlers: Mapping[str, object] | None,
) -> Assignment:
    """Check what a worker is asked to serve (no I/O) and describe it; raises ConfigError."""
    if isinstance(flow, StepQueuedFlow):
        valid = ", ".join(f'"{slug}"' for slug in flow.flow.handled_steps)
        if handlers is not None:
            raise errors.ConfigError(
                f'A worker of step-queued flow "{flow.slug}" runs one step: pass step_slug and'
                " handler, not handlers.",
                hint=f"Valid step slugs: {valid}.",
            )
        if step_slug is None or step_slug not in {r.step_slug for r in flow.routes}:
            problem = "needs a step_slug" if step_slug is None else f'has no step "{step_slug}"'
            raise errors.ConfigError(
                f'Step-queued flow "{flow.slug}" {problem}.',
                detail="A step-queued flow runs one worker process per step.",
                hint=f"Valid step slugs: {valid}.",
            )
        step = flow.flow.step(step_slug)
        if step.is_signal:
            raise errors.ConfigError(
                f'Step "{step_slug}" of flow "{flow.slug}" is a signal step: it runs no task, so'
                " no worker serves it.",
                detail="A signal step waits for Client.send_signal (or `pgflow-gen signal`).",
                hint=f"Steps with workers: {valid}.",
            )
        if step.is_subflow:
            raise errors.ConfigError(
                f'Step "{step_slug}" of flow "{flow.slug}" is a subflow step: its tasks are runs'
                f' of flow "{step.subflow_slug}", so no worker of this flow serves it.',
                detail="The engine starts the child runs; the subflow's own workers run them.",
                hint=f"Steps with workers: {valid}.",
            )
        if not callable(handler):
            raise errors.ConfigError(f'The handler of step "{step_slug}" is not callable.')
        route = flow.route(step_slug)
        return Assignment(
            flow=flow.flow,
            queue_mode="step",
            queue_name=route.queue_name,
            step_slug=step_slug,
            handlers={step_slug: handler},
            route_map=tuple(flow.route_map()),
            not_on=not_retried(flow.flow, [step_slug]),
        )
    if not isinstance(flow, Flow):
        raise errors.ConfigError(
            f"start_worker needs a Flow or a StepQueuedFlow, got {type(flow).__name__}."
        )
    if step_slug is not None or handler is not None:
        raise errors.ConfigError(
            f'Flow "{flow.slug}" uses its default queue, so its worker takes no step_slug or'
            " handler.",
            detail="One worker runs every step of a plain flow.",
            hint="Pass handlers={...} for all steps, or wrap the flow with with_step_queues() to"
            " run one worker per step.",
        )
    return _plain_assignment(flow, handlers)


def _plain_assignment(
    flow: Flow[Any, Any, Any], handlers: Mapping[str, object] | None
) -> Assignment:
    given = dict(handlers or {})
    handled = flow.handled_steps  # a signal or subflow step has no handler
    missing = [slug for slug in handled if slug not in given]
    unknown = sorted(set(given) - set(handled))
    if missing or unknown:
        problems = []
        if missing:
            problems.append("missing " + ", ".join(f'"{s}"' for s in missing))
        if unknown:
            problems.append("unknown " + ", ".join(f'"{s}"' for s in unknown))
            for kind, steps in (
                ("signal", [s for s in unknown if s in flow.step_order and flow.step(s).is_signal]),
                (
                    "subflow",
                    [s for s in unknown if s in flow.step_order and flow.step(s).is_subflow],
                ),
            ):
                if steps:
                    problems[-1] += " (" + ", ".join(f'"{s}"' for s in steps) + f" {kind} step)"
        raise errors.ConfigError(
            f'The handlers of flow "{flow.slug}" do not match its steps: {"; ".join(problems)}.',
            hint="Steps with handlers: " + ", ".join(f'"{s}"' for s in handled) + ".",
        )
    not_callable = [slug for slug, fn in given.items() if not callable(fn)]
    if not_callable:
        raise errors.ConfigError(f"Handlers of steps {', '.join(not_callable)} are not callable.")
    routes = naming.resolve_queue_routes(flow.slug, flow.step_order, "flow")
    return Assignment(
        flow=flow,
        queue_mode="flow",
        queue_name=naming.default_queue_name(flow.slug),
        step_slug=None,
        handlers={slug: fn for slug, fn in given.items() if callable(fn)},
        route_map=tuple(naming.route_map(routes)),
        not_on=not_retried(flow, handled),
    )


def _entry_command() -> str | None:
    """`python -m <module>` when this process runs a module that way (an entry file)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return f"python -m {spec.name}" if spec is not None and spec.name else None


def _configure_logging() -> None:
    if logging.getLogger().handlers:
        return
    level = os.environ.get("PGFLOW_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )

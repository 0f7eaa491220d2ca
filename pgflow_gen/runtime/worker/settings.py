"""A worker's settings: one typed object, `WorkerSettings`, given to `start_worker`, `Worker`,
`run_worker` and the testing kit, and overridden by `PGFLOW_*` variables and flags.

Precedence, strongest first: command-line flags (`--max-concurrent 8`), environment variables
(`PGFLOW_MAX_CONCURRENT=8`), keywords of the call (`start_worker(..., max_concurrent=4)`), its
`settings` object, defaults. Everything is checked before the worker connects anywhere. The
heartbeat is not a worker setting: it is part of the liveness rule every worker, coverage
report and stall sweep shares, set per database (`runtime/worker/liveness.py`).

>>> overrides(["--max-concurrent", "8"], {"PGFLOW_POLL_INTERVAL": "2.5"})
{'poll_interval': 2.5, 'max_concurrent': 8}
>>> settings(WorkerSettings(batch_size=50), {"max_concurrent": 4}).batch_size
50
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from typing_extensions import TypedDict

from pgflow_gen.runtime import errors


@dataclass(frozen=True)
class WorkerSettings:
    """How a worker runs: every field has a default, each is checked when the object is made
    (`ConfigError`), and each has a `PGFLOW_<NAME>` variable and a `--<name>` flag that win over
    it in a generated entry file (docs/workers.md, "Settings")."""

    #: Handlers in flight at once.
    max_concurrent: int = 10
    #: Most messages read per poll.
    batch_size: int = 10
    #: Seconds an idle worker sleeps when nothing wakes it.
    poll_interval: float = 5.0
    #: Seconds running handlers may finish after SIGTERM/SIGINT or a stop.
    shutdown_grace: float = 30.0
    #: The name in pgflow.workers and `pgflow-gen workers` (None: <flow>-<step>).
    worker_name: str | None = None
    #: Wake on PGMQ insert notifications (off: poll every poll_interval).
    notifications: bool = True
    #: Seconds between stall-recovery sweeps (one worker at a time across all workers runs one).
    recovery_interval: float = 15.0
    #: Off behind a transaction-pooling PgBouncer before 1.21, which cannot keep them.
    prepared_statements: bool = True
    #: Check every output against its step's output type (off: for outputs too large to check).
    check_outputs: bool = True
    #: Seconds a starting worker keeps trying to reach the database before it gives up.
    connect_timeout: float = 30.0
    #: Seconds a read message stays hidden until its claim sets the real lease (the step's
    #: timeout and 2 s); a message the claim does not take shows again after this.
    read_visibility: int = 10
    #: Serve Prometheus metrics at /metrics on this port (None: not served; 0: any free port).
    metrics_port: int | None = None
    #: The address the metrics are served on: loopback unless asked, as the dashboard's rule.
    metrics_host: str = "127.0.0.1"
    #: Take part in starting the flows' scheduled runs (one worker per database at a time).
    schedules: bool = True

    def __post_init__(self) -> None:
        check(dataclasses.asdict(self))


class SettingKeywords(TypedDict, total=False):
    """`WorkerSettings`' fields as keywords of `start_worker`, `Worker` and `run_worker`."""

    max_concurrent: int | None
    batch_size: int | None
    poll_interval: float | None
    shutdown_grace: float | None
    worker_name: str | None
    notifications: bool | None
    recovery_interval: float | None
    prepared_statements: bool | None
    check_outputs: bool | None
    connect_timeout: float | None
    read_visibility: int | None
    metrics_port: int | None
    metrics_host: str | None
    schedules: bool | None


@dataclass(frozen=True)
class _Option:
    name: str
    parse: Callable[[str], Any]
    check: Callable[[Any], bool]
    rule: str
    help: str


def _flag(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "on", "yes"}:
        return True
    if lowered in {"0", "false", "off", "no"}:
        return False
    raise ValueError(text)


_OPTIONS = (
    _Option(
        "max_concurrent", int, lambda v: v >= 1, "a whole number of at least 1",
        "handlers in flight at once (default: the entry file's value, else 10)",
    ),
    _Option(
        "batch_size", int, lambda v: v >= 1, "a whole number of at least 1",
        "most messages read per poll (default: 10)",
    ),
    _Option(
        "poll_interval", float, lambda v: math.isfinite(v) and v > 0, "seconds above 0",
        "seconds an idle worker sleeps when nothing wakes it (default: 5)",
    ),
    _Option(
        "shutdown_grace", float, lambda v: math.isfinite(v) and v >= 0, "seconds, 0 or more",
        "seconds running handlers may finish after SIGTERM or SIGINT (default: 30)",
    ),
    _Option(
        "worker_name", str, lambda v: bool(v.strip()), "a non-empty name",
        "the name in pgflow.workers and `pgflow-gen workers` (default: <flow>-<step>)",
    ),
    _Option(
        "notifications", _flag, lambda v: True, "on or off",
        "wake on PGMQ insert notifications, on or off (default: on)",
    ),
    _Option(
        "schedules", _flag, lambda v: True, "on or off",
        "take part in starting the flows' scheduled runs, on or off (default: on)",
    ),
    _Option(
        "recovery_interval", float, lambda v: math.isfinite(v) and v > 0, "seconds above 0",
        "seconds between stall-recovery sweeps (default: 15)",
    ),
    _Option(
        "prepared_statements", _flag, lambda v: True, "on or off",
        "prepare repeated statements, on or off; off behind a transaction-pooling PgBouncer"
        " (default: on)",
    ),
    _Option(
        "check_outputs", _flag, lambda v: True, "on or off",
        "check every handler output against its step's output type, on or off (default: on)",
    ),
    _Option(
        "connect_timeout", float, lambda v: math.isfinite(v) and v > 0, "seconds above 0",
        "seconds a starting worker keeps trying to reach the database (default: 30)",
    ),
    _Option(
        "read_visibility", int, lambda v: v >= 1, "a whole number of at least 1",
        "seconds a read message stays hidden until its claim sets its lease (default: 10)",
    ),
    _Option(
        "metrics_port", int, lambda v: 0 <= v <= 65535, "a port number from 0 to 65535",
        "serve Prometheus metrics at /metrics on this port (default: not served)",
    ),
    _Option(
        "metrics_host", str, lambda v: bool(v.strip()), "a non-empty address",
        "the address the metrics are served on (default: 127.0.0.1; 0.0.0.0 for a scraper"
        " on another host)",
    ),
)  # fmt: skip


# The Python types a setting given in code may have (bool is not a number here).
_TYPES: dict[Callable[[str], Any], tuple[type, ...]] = {
    int: (int,),
    float: (int, float),
    str: (str,),
    _flag: (bool,),
}


def overrides(
    argv: Sequence[str],
    environ: Mapping[str, str],
    *,
    serves: str = "a flow",
    prog: str | None = None,
) -> dict[str, Any]:
    """The settings given by `PGFLOW_<NAME>` variables and `--<name>` flags (flags win).
    `serves` describes the worker for `--help`."""
    found: dict[str, Any] = {}
    for option in _OPTIONS:
        variable = "PGFLOW_" + option.name.upper()
        if variable in environ:
            found[option.name] = _parse(option, environ[variable], variable)
    parser = argparse.ArgumentParser(
        prog=prog,
        add_help=True,
        description=f"Run the pgflow-gen worker of {serves} until SIGTERM or SIGINT.",
        epilog="Each flag may also be set as a PGFLOW_<NAME> variable (PGFLOW_MAX_CONCURRENT=8);"
        " flags win over variables, which win over the entry file's values. Docs:"
        " docs/workers.md.",
    )
    for option in _OPTIONS:
        parser.add_argument(
            "--" + option.name.replace("_", "-"),
            dest=option.name,
            metavar=option.name.upper(),
            help=option.help,
        )
    parser.add_argument(
        "--database-url",
        dest="database_url",
        help="PostgreSQL URL (default: $PGFLOW_DATABASE_URL, else $DATABASE_URL, else the"
        " project's embedded server)",
    )
    parsed = parser.parse_args(list(argv))
    for option in _OPTIONS:
        raw = getattr(parsed, option.name)
        if raw is not None:
            found[option.name] = _parse(option, raw, "--" + option.name.replace("_", "-"))
    if parsed.database_url:
        found["database_url"] = parsed.database_url
    return found


def settings(
    base: WorkerSettings | None,
    keywords: Mapping[str, Any],
    overrides: Mapping[str, Any] | None = None,
) -> WorkerSettings:
    """`base` (None: the defaults) with the `keywords` of a call that are not None, then
    `overrides` (environment and command line), checked: ConfigError for an unknown keyword
    or a wrong value."""
    known = {f.name for f in dataclasses.fields(WorkerSettings)}
    unknown = sorted(set(keywords) - known)
    if unknown:
        raise errors.ConfigError(
            f"Unknown worker setting {unknown[0]!r}.",
            hint="Worker settings are " + ", ".join(sorted(known)) + " (docs/workers.md).",
        )
    if base is not None and not isinstance(base, WorkerSettings):
        raise errors.ConfigError(
            f"settings must be a WorkerSettings, got {type(base).__name__}.",
            hint="from pgflow_gen.runtime import WorkerSettings",
        )
    changes = {key: value for key, value in keywords.items() if value is not None}
    changes.update(overrides or {})
    return dataclasses.replace(base or WorkerSettings(), **changes)


def check(values: Mapping[str, Any]) -> None:
    """Raise ConfigError for a setting of the wrong type or outside its range."""
    for option in _OPTIONS:
        value = values.get(option.name)
        if value is None:
            continue
        expected = _TYPES.get(option.parse, (str,))
        if (isinstance(value, bool) and bool not in expected) or not isinstance(value, expected):
            raise errors.ConfigError(
                f"Invalid worker setting {option.name}={value!r}.",
                hint=f"{option.name} must be {option.rule}.",
            )
        if not option.check(value):
            raise errors.ConfigError(
                f"Invalid worker setting {option.name}={value!r}.",
                hint=f"{option.name} must be {option.rule}.",
            )


def _parse(option: _Option, raw: str, source: str) -> Any:
    try:
        value = option.parse(raw)
    except ValueError:
        raise errors.ConfigError(
            f"Invalid value {raw!r} for {source}.", hint=f"It must be {option.rule}."
        ) from None
    if not option.check(value):
        raise errors.ConfigError(
            f"Invalid value {raw!r} for {source}.", hint=f"It must be {option.rule}."
        )
    return value

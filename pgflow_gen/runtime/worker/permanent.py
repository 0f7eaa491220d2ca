"""Failures that are not retried. A handler raises `PermanentError` (or a subclass of it), or an
exception of a class its step lists in `retry.not_on`: its task fails at once, whatever attempts
are left, and the engine stores why (engine 0011: `fail_task(..., permanent_reason)`).

>>> def charge(deps, ctx):
...     raise PermanentError("card 4242 was declined")
>>> try:
...     charge({}, None)
... except Exception as exc:
...     print(reason(exc, resolve(["ValueError"])))
the handler raised PermanentError
"""

from __future__ import annotations

import builtins
import importlib
from collections.abc import Sequence
from typing import NamedTuple

from pgflow_gen.runtime import errors


class PermanentError(Exception):
    """Raise it (or a subclass) from a handler when no retry can succeed, a declined card or a
    malformed document: the task fails at once, whatever attempts are left, and its stored
    error says it was not retried and why."""


class NotRetried(NamedTuple):
    """An exception class a step does not retry, with its name as the spec lists it."""

    cls: type[BaseException]
    listed: str


def resolve(names: Sequence[str]) -> tuple[NotRetried, ...]:
    """The exception classes `names` spell: a builtin exception's name (`ValueError`) or an
    import path (`package.module:Class`), imported now. Raises ConfigError naming the first
    that is no exception class or does not import."""
    resolved = []
    for name in names:
        module_name, colon, attr = name.rpartition(":")
        try:
            if colon:
                found = getattr(importlib.import_module(module_name), attr)
            else:
                found = getattr(builtins, name)
        except (ImportError, AttributeError) as exc:
            raise errors.ConfigError(
                f'retry.not_on names "{name}", which does not import: {exc}.',
                hint='Name a builtin exception ("ValueError") or write'
                ' "package.module:ExceptionClass".',
            ) from None
        if not (isinstance(found, type) and issubclass(found, BaseException)):
            raise errors.ConfigError(
                f'retry.not_on names "{name}", which is not an exception class.',
                hint="List exception classes only: their instances fail a task at once.",
            )
        resolved.append(NotRetried(found, name))
    return tuple(resolved)


def reason(exc: BaseException, not_on: Sequence[NotRetried]) -> str | None:
    """Why `exc` is not retried (for the engine to store after the error's first line), or
    None when it is an ordinary failure."""
    kind = type(exc).__name__
    if isinstance(exc, PermanentError):
        if type(exc) is PermanentError:
            return "the handler raised PermanentError"
        return f"the handler raised {kind}, a PermanentError"
    for entry in not_on:
        if isinstance(exc, entry.cls):
            what = kind if type(exc) is entry.cls else f"{kind}, a {entry.cls.__name__},"
            return f"{what} is listed in the step's retry.not_on ({entry.listed})"
    return None

"""What a handler gets besides its input: who and where it runs, and how to stop early."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import psycopg

InputT = TypeVar("InputT")


@dataclass(frozen=True)
class Context(Generic[InputT]):
    """The second argument of every handler.

    `flow_input()` loads the run input on first use (map tasks do not carry it); `shutdown` is set
    when the worker drains, so long handlers can stop early; `connection` is a database
    connection for the handler's own queries.
    """

    run_id: uuid.UUID
    step_slug: str
    task_index: int
    attempt: int
    worker_id: uuid.UUID
    shutdown: threading.Event
    logger: logging.Logger
    connection: psycopg.Connection[Any]
    _load_flow_input: Callable[[], InputT]

    def flow_input(self) -> InputT:
        return self._load_flow_input()

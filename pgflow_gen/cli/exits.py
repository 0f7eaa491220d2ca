"""The exit statuses of `pgflow-gen` (docs/errors.md): 0 success, 1 failure (a stale --check, a
failed run, a database error), 2 usage error (an invalid spec, a bad option, an unknown flow), 70
internal error (a bug), 130 interrupted, 141 a closed pipe."""

from __future__ import annotations

import signal

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 70  # EX_SOFTWARE of sysexits.h
EXIT_INTERRUPTED = 128 + signal.SIGINT
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # what a shell reports for a tool killed by SIGPIPE

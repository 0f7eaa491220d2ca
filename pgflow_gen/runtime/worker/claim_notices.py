"""What the engine's claims say beside the tasks they return: the notices in which a claim names
the messages it archived, held (a paused step), held back (a step at its limit) or left
unclaimed, when the next hidden message shows again, and the results complete_and_claim
ignored. A session hears them on its connection and reads them after each claim; a notice of
another shape than this release's is ignored, and the worker polls as before.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field

import psycopg

from pgflow_gen.runtime.claimed_task import ClaimedTask
from pgflow_gen.runtime.worker.session import Claim

#: How claim_tasks (engine 0008) names the messages it archived: its warning's first words.
ARCHIVED_NOTICE = "claim_tasks archived"
#: The start of the notice in which claim_tasks names the messages of paused steps it held.
HELD_NOTICE = "claim_tasks held"
#: The start of the notice in which read_and_claim (engine 0012) names what it left unclaimed.
UNCLAIMED_NOTICE = "read_and_claim left"
#: The start of its notice of when the queue's next hidden message shows again.
NEXT_VISIBLE_NOTICE = "read_and_claim: the next message"
#: The start of the notice in which complete_and_claim (engine 0014) names the results it
#: ignored (a stale attempt, a cancelled task).
IGNORED_NOTICE = "complete_and_claim ignored"
#: The start of the notice in which a claim (engine 0017) names the messages it held back
#: because their step was at a limit (max_in_flight or rate_limit).
LIMITED_NOTICE = "claim_tasks limited"
#: The start of read_and_claim's notice that a limit let it read fewer than it was asked for.
LIMITED_READ_NOTICE = "read_and_claim limited"


@dataclass
class ClaimNotices:
    """The notices of the claim under way (`clear` before each)."""

    archived: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)
    unclaimed: list[int] = field(default_factory=list)
    limited: list[int] = field(default_factory=list)
    cut_short: bool = False
    next_visible_in: float | None = None
    #: (position of the result, the task's attempts_count, its status) of each ignored result.
    ignored: list[tuple[int, int, str]] = field(default_factory=list)

    def clear(self) -> None:
        self.archived, self.held, self.unclaimed, self.limited = [], [], [], []
        self.cut_short, self.next_visible_in, self.ignored = False, None, []

    def claim(self, tasks: list[ClaimedTask]) -> Claim:
        """A claim's tasks with what its notices said."""
        return Claim(
            tasks,
            self.archived,
            self.held,
            tuple(self.unclaimed),
            self.next_visible_in,
            tuple(self.limited),
            self.cut_short,
        )

    def hear(self, diag: psycopg.errors.Diagnostic) -> None:
        """Collect the ids claim_tasks names in its archived-messages warning, its
        held-messages and limited-messages notices, and read_and_claim in its
        unclaimed-messages notice (JSON details)."""
        primary = diag.message_primary or ""
        if primary.startswith(NEXT_VISIBLE_NOTICE):
            # Another detail than this release writes: the worker polls as before.
            with contextlib.suppress(ValueError, TypeError, KeyError):
                detail = json.loads(diag.message_detail or "")
                self.next_visible_in = float(detail["next_visible_in_s"])
            return
        if primary.startswith(IGNORED_NOTICE):
            with contextlib.suppress(ValueError, TypeError, KeyError):
                self.ignored = [
                    (int(position), int(attempts_count), str(status))
                    for position, attempts_count, status in json.loads(diag.message_detail or "")[
                        "ignored_results"
                    ]
                ]
            return
        if primary.startswith(LIMITED_READ_NOTICE):
            self.cut_short = True
            return
        if primary.startswith(ARCHIVED_NOTICE):
            into, key = self.archived, "archived_message_ids"
        elif primary.startswith(LIMITED_NOTICE):
            into, key = self.limited, "limited_message_ids"
        elif primary.startswith(HELD_NOTICE):
            into, key = self.held, "held_message_ids"
        elif primary.startswith(UNCLAIMED_NOTICE):
            into, key = self.unclaimed, "unclaimed_message_ids"
        else:
            return
        try:
            into.extend(int(i) for i in json.loads(diag.message_detail or "")[key])
        except (ValueError, TypeError, KeyError):
            return  # not the detail this release writes: nothing to add

"""A step's limits in words, as `limits`, `status`, the dashboard and `StepLimits.in_words` say
them: counts agree with their nouns, and an operator's limits over the spec's say whose they are
and what the spec says."""

from __future__ import annotations

import datetime
from typing import Any

from pgflow_gen.runtime.client import limits_in_words

KEYED: dict[str, Any] = {"max_in_flight": None, "rate_limit": None, "limit_per_key": 2,
                         "key_path": "$.tenant", "keys_waiting": 1, "busiest_key": "a"}  # fmt: skip


def test_one_key_and_one_task_are_singular() -> None:
    assert limits_in_words({**KEYED, "keys_active": 1, "parked": 1}) == (
        "2 per $.tenant: 1 key in flight, 1 waiting (1 task, most for 'a')"
    )
    assert limits_in_words({**KEYED, "keys_active": 2, "parked": 1_500}) == (
        "2 per $.tenant: 2 keys in flight, 1 waiting (1,500 tasks, most for 'a')"
    )


def test_an_operators_limits_over_the_specs_say_so_and_the_specs_beside() -> None:
    at = datetime.datetime(
        2026, 12, 5, 11, 2, tzinfo=datetime.timezone(datetime.timedelta(hours=1))
    )
    limits = {"max_in_flight": 5, "in_flight": 5, "rate_limit": None, "overridden_at": at,
              "overridden_by": "ada", "spec_max_in_flight": 3, "spec_rate_limit": 100,
              "spec_rate_period_s": 60}  # fmt: skip
    assert limits_in_words(limits) == (
        "5/5 in flight (an operator's, set by ada on 2026-12-05 10:02 UTC; the spec says at"
        " most 3 in flight, 100 starts per 60 s)"
    )
    # Lifted: an operator's "no limits" over the spec's.
    lifted = {**limits, "max_in_flight": None, "spec_rate_limit": None}
    assert limits_in_words(lifted) == (
        "no limits (an operator's, set by ada on 2026-12-05 10:02 UTC; the spec says at most 3"
        " in flight)"
    )
    # On a step the spec does not limit, an operator's limits are simply the step's.
    assert limits_in_words({**limits, "spec_max_in_flight": None, "spec_rate_limit": None}) == (
        "5/5 in flight"
    )

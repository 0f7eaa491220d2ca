"""A worker's connections share one `Outage`: an outage is one warning and one line when it is
over, whichever connections notice it; a connection found dead just after reconnects quietly
unless it cannot connect."""

from __future__ import annotations

import logging

import pytest

from pgflow_gen.runtime.reconnecting import Outage

LOG = logging.getLogger("tests.outage")


def said(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    found = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    caplog.clear()
    return found


def test_an_outage_is_two_lines_whatever_each_connection_does(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, LOG.name)
    outage = Outage(LOG)
    outage.down("notifications", "server closed the connection")
    for retry in (0.25, 0.5, 1.0):
        outage.down("polling", "connection refused", retry)
        outage.down("notifications", "connection refused", retry)
    outage.back("notifications")
    assert said(caplog) == [
        ("WARNING", "lost the database connection (notifications): server closed the connection;"
                    " retrying until it is back"),
    ]  # fmt: skip
    outage.back("polling")
    [(level, message)] = said(caplog)
    assert level == "INFO"
    assert message.startswith("the database connection is back after ")

    # An idle connection found dead right after: quiet, as it reconnects at once.
    outage.down("results", "terminating connection due to administrator command")
    outage.back("results")
    assert said(caplog) == []
    # But one that cannot connect is a new outage, and said.
    outage.down("results", "terminating connection")
    outage.down("results", "connection refused", 0.25)
    assert said(caplog) == [
        ("WARNING", "lost the database connection (results): connection refused; retrying until"
                    " it is back"),
    ]  # fmt: skip


def test_a_loss_long_after_the_last_outage_is_said(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOG.name)
    outage = Outage(LOG)
    outage.AFTERMATH_S = 0.0
    outage.down("polling", "gone")
    outage.back("polling")
    outage.down("polling", "gone again")
    assert [message for _, message in said(caplog)][-1].startswith(
        "lost the database connection (polling): gone again"
    )

"""Tests of flow expenseApprovalV1 with the testing kit: the whole flow in process, with the
manager's decision sent as the approval step's signal."""

from __future__ import annotations

import pytest
from app import handlers
from app.pgflow.expense_approval_v1 import FLOW, STEP_QUEUED_FLOW, ApprovalPayload, Handlers, Input

from pgflow_gen.testing import FlowDatabase, RunStuckError, fake_context

HANDLERS: Handlers = {
    "checkClaim": handlers.check_claim,
    "reimburse": handlers.reimburse,
    "notifyEmployee": handlers.notify_employee,
}
CLAIM = Input(employee="Ada", amount_cents=4200, purpose="train to Turin")


def test_an_approved_claim_is_paid_and_the_employee_told(pgflow: FlowDatabase) -> None:
    approval = ApprovalPayload(approved=True, approver="Grace", comment="safe travels")
    run = pgflow.run_flow(
        STEP_QUEUED_FLOW, handlers=HANDLERS, input=CLAIM, signals={"approval": approval}
    )
    assert run.status == "completed"
    assert run.output == {
        "reimburse": "paid (Ada: 42.00 EUR for train to Turin), approved by Grace",
        "notifyEmployee": "Your claim (Ada: 42.00 EUR for train to Turin) was approved by"
        " Grace: safe travels",
    }


def test_a_declined_claim_is_not_paid(pgflow: FlowDatabase) -> None:
    approval = ApprovalPayload(approved=False, approver="Grace")
    run = pgflow.run_flow(FLOW, handlers=HANDLERS, input=CLAIM, signals={"approval": approval})
    assert run.status == "completed"
    assert run.output == {
        "notifyEmployee": "Your claim (Ada: 42.00 EUR for train to Turin) was declined by Grace"
    }


def test_a_claim_that_cannot_be_paid_fails_at_once_without_retries(pgflow: FlowDatabase) -> None:
    claim = Input(employee="Ada", amount_cents=-5, purpose="refund")
    run = pgflow.run_flow(FLOW, handlers=HANDLERS, input=claim)
    assert run.status == "failed"
    assert run.failure is not None
    assert run.failure.attempts == 1
    assert run.failure.summary == "ClaimRejected: an expense of -5 cents cannot be reimbursed"
    assert run.failure.error is not None
    assert "Not retried (attempt 1 of 3): the handler raised ClaimRejected" in run.failure.error


def test_the_run_waits_for_the_managers_decision(pgflow: FlowDatabase) -> None:
    with pytest.raises(RunStuckError, match='waits for the signal of step "approval"'):
        pgflow.run_flow(FLOW, handlers=HANDLERS, input=CLAIM)


def test_a_large_claim_says_it_needs_a_director() -> None:
    claim = Input(employee="Ada", amount_cents=250_000, purpose="a conference")
    assert handlers.check_claim(claim, fake_context(claim))["needs_director"] is True

"""Handlers of flow expenseApprovalV1. The approval step has none: a person decides it."""

from __future__ import annotations

from app.pgflow.expense_approval_v1 import (
    CheckClaimOutput,
    Input,
    NotifyEmployeeDeps,
    ReimburseDeps,
    Steps,
)
from pgflow_gen.runtime import Context, PermanentError

#: Claims above this need a director's approval too (the approver sees it in the summary).
DIRECTOR_LIMIT_CENTS = 100_000


class ClaimRejected(PermanentError):
    """A claim no retry can fix: the task fails at once, with this reason."""


@Steps.check_claim
def check_claim(flow_input: Input, ctx: Context[Input], /) -> CheckClaimOutput:
    amount = flow_input["amount_cents"]
    if amount <= 0:
        raise ClaimRejected(f"an expense of {amount} cents cannot be reimbursed")
    if not flow_input["purpose"].strip():
        raise ValueError("the claim gives no purpose")  # listed in retry.not_on: not retried
    summary = f"{flow_input['employee']}: {amount / 100:.2f} EUR for {flow_input['purpose']}"
    return {"summary": summary, "needs_director": amount > DIRECTOR_LIMIT_CENTS}


@Steps.reimburse
def reimburse(deps: ReimburseDeps, ctx: Context[Input], /) -> str:
    approval = deps["approval"]
    return f"paid ({deps['checkClaim']['summary']}), approved by {approval['approver']}"


@Steps.notify_employee
def notify_employee(deps: NotifyEmployeeDeps, ctx: Context[Input], /) -> str:
    approval = deps["approval"]
    verdict = "approved" if approval["approved"] else "declined"
    comment = f": {approval['comment']}" if "comment" in approval else ""
    claim = deps["checkClaim"]["summary"]
    return f"Your claim ({claim}) was {verdict} by {approval['approver']}{comment}"

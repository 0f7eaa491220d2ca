"""Signal payloads the generated types must catch. Each marked line MUST be an error for mypy
(the ignore's code; the run uses --warn-unused-ignores) and for pyright (tests/golden/
test_pyright.py runs it with ignore comments off and expects exactly the marked lines).
Checked against examples/human_approval; never executed."""

from __future__ import annotations

import uuid

from app.pgflow.expense_approval_v1 import FLOW, ApprovalPayload, CheckClaimOutput

from pgflow_gen.runtime import Client


def never_called(client: Client, run_id: uuid.UUID, other: CheckClaimOutput) -> None:
    fine = ApprovalPayload(approved=True, approver="Grace")
    client.send_signal(run_id, FLOW.signals.approval, fine)
    client.send_signal(run_id, FLOW.signals.approval, ApprovalPayload(approved="yes", approver="G"))  # type: ignore[typeddict-item]
    client.send_signal(run_id, FLOW.signals.approval, other)  # type: ignore[misc]
    client.send_signal(run_id, FLOW.signals.aproval, fine)  # type: ignore[attr-defined]
    client.send_signal(run_id, FLOW.signals.approval, {"approved": "no", "approver": "G"})  # type: ignore[misc]
    client.send_signal(run_id, FLOW.signals.approval)  # type: ignore[call-overload]

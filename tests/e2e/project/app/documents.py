"""Handlers of e2eDocuments and of its subflow e2eDocument. A document steers its run: `gate`
names a file `parse` waits for (so a test holds a child in flight), `fail_once` fails its first
attempt, and `bug` names a file whose presence makes `store` fail (a bug, fixed by removing
it)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from app.pgflow.e2e_document import Input as DocumentInput
from app.pgflow.e2e_document import ParseOutput, StoreDeps
from app.pgflow.e2e_documents import CountDeps
from app.pgflow.e2e_documents import Input as DocumentsInput
from pgflow_gen.runtime import Context

GATE_DEADLINE = 60.0


async def parse(flow_input: DocumentInput, ctx: Context[DocumentInput], /) -> ParseOutput:
    gate = flow_input.get("gate")
    if gate:
        deadline = time.monotonic() + GATE_DEADLINE
        while not Path(gate).exists():  # a cancel stops this at its next await
            if time.monotonic() > deadline:
                raise TimeoutError(f"gate {gate} never opened")
            await asyncio.sleep(0.02)
    if flow_input.get("fail_once") and ctx.attempt == 1:
        raise RuntimeError(f"planned failure of {flow_input['name']}")
    return {"words": len(flow_input["name"].split())}


def store(deps: StoreDeps, ctx: Context[DocumentInput], /) -> str:
    document = ctx.flow_input()
    bug = document.get("bug")
    if bug and Path(bug).exists():
        raise RuntimeError(f"a bug in store ({bug})")
    return f"{document['name']}: {deps['parse']['words']} words"


def count(deps: CountDeps, ctx: Context[DocumentsInput], /) -> int:
    return sum(child["store"].count("words") for child in deps["each"])

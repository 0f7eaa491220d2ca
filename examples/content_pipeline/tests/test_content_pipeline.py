"""Tests of flow contentPipelineV1 with the testing kit: the map fan-out, a step skipped after
its retries, and the summary."""

from __future__ import annotations

from app import handlers
from app.pgflow.content_pipeline_v1 import (
    STEP_QUEUED_FLOW,
    EnrichDeps,
    EnrichOutput,
    Handlers,
    Input,
)

from pgflow_gen.runtime import Context
from pgflow_gen.testing import FlowDatabase

HANDLERS: Handlers = {
    "fetchPages": handlers.fetch_page,
    "enrich": handlers.enrich,
    "summarize": handlers.summarize,
}
PAGES: Input = ["https://a.example", "https://bb.example"]


def test_fetches_every_page_and_summarizes_them(pgflow: FlowDatabase) -> None:
    run = pgflow.run_flow(STEP_QUEUED_FLOW, handlers=HANDLERS, input=PAGES)
    assert run.status == "completed"
    assert run.output == {"summarize": "2 pages, 350 words, 2 scored"}


def test_an_enrichment_outage_skips_enrich_and_the_summary_says_so(pgflow: FlowDatabase) -> None:
    attempts: list[int] = []

    def enrichment_down(deps: EnrichDeps, ctx: Context[Input], /) -> EnrichOutput:
        attempts.append(ctx.attempt)
        raise ConnectionError("enrichment API unreachable")

    run = pgflow.run_flow(
        STEP_QUEUED_FLOW, handlers={**HANDLERS, "enrich": enrichment_down}, input=PAGES
    )
    assert attempts == [1, 2]  # max_attempts: 2, retried at once (no backoff sleep in tests)
    assert run.status == "completed"
    assert run.output == {"summarize": "2 pages, 350 words, not enriched"}

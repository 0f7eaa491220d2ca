"""Handlers of flow contentPipelineV1 (a map fan-out and a step that may be skipped)."""

from __future__ import annotations

from app.pgflow.content_pipeline_v1 import (
    EnrichDeps,
    EnrichOutput,
    FetchPagesItem,
    FetchPagesItemOutput,
    Input,
    Steps,
    SummarizeDeps,
)
from pgflow_gen.runtime import Context


@Steps.fetch_pages
def fetch_page(item: FetchPagesItem, ctx: Context[Input], /) -> FetchPagesItemOutput:
    return {"url": item, "words": len(item) * 10}


@Steps.enrich
def enrich(deps: EnrichDeps, ctx: Context[Input], /) -> EnrichOutput:
    return {page["url"]: page["words"] / 100 for page in deps["fetchPages"]}


@Steps.summarize
def summarize(deps: SummarizeDeps, ctx: Context[Input], /) -> str:
    total = sum(page["words"] for page in deps["fetchPages"])
    scores = deps.get("enrich")  # absent when enrichment was skipped
    suffix = f", {len(scores)} scored" if scores is not None else ", not enriched"
    return f"{len(deps['fetchPages'])} pages, {total} words{suffix}"

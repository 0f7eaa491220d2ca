"""The testing kit: run a flow in a pytest test through the real engine, or call one handler
with a fake `ctx`.

With pgflow-gen installed, pytest has a `pgflow` fixture (plugin `pgflow_gen.testing.plugin`,
used only by tests that ask for it): a fresh database with the engine for each test, and
`pgflow.run_flow(FLOW, handlers=..., input=...)`, which runs every step in process.

    from app.pgflow.greet_user import FLOW, Handlers
    from pgflow_gen.testing import FlowDatabase

    def test_greets_by_full_name(pgflow: FlowDatabase) -> None:
        handlers: Handlers = {"fullName": full_name, "greeting": greeting}
        run = pgflow.run_flow(FLOW, handlers=handlers, input={"first": "Ada", "last": "L"})
        assert run.output == {"greeting": "Hello, Ada L!"}

See docs/testing.md.
"""

from __future__ import annotations

from pgflow_gen.testing.fake import fake_context
from pgflow_gen.testing.flow_database import FlowDatabase
from pgflow_gen.testing.runner import RunStuckError

__all__ = ["FlowDatabase", "RunStuckError", "fake_context"]

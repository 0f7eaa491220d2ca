"""Direct SQL writes are held to the naming rules of version 2 by constraints and indexes."""

from __future__ import annotations

import psycopg
import pytest

from tests.engine import Engine


@pytest.mark.parametrize("slug", ["_x", "x_", "a__b", "run", "9x"])
def test_a_flow_row_with_an_invalid_slug_is_refused(engine: Engine, slug: str) -> None:
    with pytest.raises(psycopg.errors.CheckViolation, match="flow_slug_is_valid"):
        engine.conn.execute("insert into pgflow.flows (flow_slug) values (%s)", (slug,))


def test_flow_slugs_are_unique_ignoring_case(engine: Engine) -> None:
    engine.conn.execute("insert into pgflow.flows (flow_slug) values ('Orders')")
    with pytest.raises(psycopg.errors.UniqueViolation, match="flows_flow_slug_lower_idx"):
        engine.conn.execute("insert into pgflow.flows (flow_slug) values ('orders')")


def test_step_slugs_are_unique_ignoring_case_within_a_flow(engine: Engine) -> None:
    engine.flow("orders", {"slug": "fetch"})
    engine.flow("other", {"slug": "Fetch"})
    with pytest.raises(psycopg.errors.UniqueViolation, match="steps_flow_slug_lower_step_slug_idx"):
        engine.conn.execute(
            "insert into pgflow.steps (flow_slug, step_slug, step_index, queue_name)"
            " values ('orders', 'FETCH', 1, 'orders')"
        )


def test_add_step_rejects_a_case_only_duplicate(engine: Engine) -> None:
    engine.flow("orders", {"slug": "fetch"})
    with pytest.raises(psycopg.errors.UniqueViolation, match='duplicates "fetch"'):
        engine.call("add_step", "orders", "Fetch")

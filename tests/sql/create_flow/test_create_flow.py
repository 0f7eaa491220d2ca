from __future__ import annotations

import psycopg
import pytest

from pgflow_gen.naming import SLUG_HINT, slug_violation
from tests.engine import Engine


def test_creates_the_flow_with_default_options(engine: Engine) -> None:
    [flow] = engine.call("create_flow", "greetUser")
    assert (flow["opt_max_attempts"], flow["opt_base_delay"], flow["opt_timeout"]) == (3, 5, 60)


def test_creates_the_lower_cased_flow_queue(engine: Engine) -> None:
    engine.call("create_flow", "greetUser")
    assert engine.value("select count(*) from pgmq.meta where queue_name = 'greetuser'") == 1


def test_is_idempotent(engine: Engine) -> None:
    first = engine.call("create_flow", "greetUser", max_attempts=4)
    again = engine.call("create_flow", "greetUser", max_attempts=4)
    assert first == again
    assert engine.value("select count(*) from pgflow.flows") == 1


def test_never_changes_the_options_of_an_existing_flow(engine: Engine) -> None:
    engine.call("create_flow", "greetUser", timeout=30)
    with pytest.raises(
        psycopg.errors.UniqueViolation, match="already exists with different options"
    ):
        engine.call("create_flow", "greetUser", timeout=45)
    assert engine.value("select opt_timeout from pgflow.flows") == 30


@pytest.mark.parametrize("slug", ["1flow", "my-flow", "run", "", "x" * 129])
def test_rejects_an_invalid_slug_and_writes_nothing(engine: Engine, slug: str) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="Invalid flow slug"):
        engine.call("create_flow", slug)
    assert engine.value("select count(*) from pgflow.flows") == 0


@pytest.mark.parametrize("slug", ["_legacy", "double__under", "trailing_", "9lives"])
def test_rejects_slugs_that_break_the_rules_with_the_resolvers_texts(
    engine: Engine, slug: str
) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
        engine.call("create_flow", slug)
    assert raised.value.diag.message_primary == f'Invalid flow slug "{slug}".'
    assert raised.value.diag.message_detail == f"The slug is invalid: {slug_violation(slug)}."
    assert raised.value.diag.message_hint == SLUG_HINT
    assert engine.value("select count(*) from pgflow.flows") == 0


def test_rejects_a_slug_differing_only_in_case_from_an_existing_flow(engine: Engine) -> None:
    engine.call("create_flow", "Orders")
    with pytest.raises(
        psycopg.errors.UniqueViolation, match='differs only in case from the existing flow "Orders"'
    ):
        engine.call("create_flow", "orders")
    assert engine.value("select count(*) from pgflow.flows") == 1


def test_rejects_a_slug_too_long_for_its_default_queue(engine: Engine) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="cannot use its default queue"):
        engine.call("create_flow", "f" * 48)
    assert engine.value("select count(*) from pgflow.flows") == 0


def test_never_adopts_a_queue_it_did_not_create(engine: Engine) -> None:
    engine.conn.execute("select pgmq.create('orders')")
    with pytest.raises(psycopg.errors.DuplicateObject, match="a queue of that name already exists"):
        engine.call("create_flow", "orders")
    assert engine.value("select count(*) from pgflow.flows") == 0


@pytest.mark.parametrize(
    "options", [{"max_attempts": 0}, {"base_delay": -1}, {"timeout": 0}, {"timeout": -5}]
)
def test_rejects_out_of_range_options(engine: Engine, options: dict[str, int]) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="Invalid options"):
        engine.call("create_flow", "greetUser", **options)
    assert engine.value("select count(*) from pgflow.flows") == 0

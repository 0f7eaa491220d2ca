"""Table triggers (engine 0032): pgflow.set_flow_triggers keeps a flow's triggers what its spec
lists, checked against the table and the flow's input schema; a write that a trigger's `when`
lets through starts a run in the writing transaction, its input mapped from the row."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.engine import Engine
from tests.roles import Logins

ORDERS = """
create table public.orders (
  id bigint generated always as identity primary key,
  status text not null default 'new',
  amount numeric not null default 0,
  note text
)
"""
SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "integer"}, "total": {"type": "number"}},
    "required": ["order_id"],
}


def trigger(**fields: Any) -> dict[str, Any]:
    """A trigger as the generated migration gives it: on orders, order_id from id."""
    return {"name": "paid", "table": "public.orders", "input": {"order_id": "id"}} | fields


def set_triggers(engine: Engine, flow: str, *triggers: dict[str, Any]) -> dict[str, Any]:
    return engine.value("select pgflow.set_flow_triggers(%s, %s)", flow, Jsonb(list(triggers)))  # type: ignore[no-any-return]


def refusal(engine: Engine, flow: str, *triggers: dict[str, Any]) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as caught, engine.conn.transaction():
        set_triggers(engine, flow, *triggers)
    return caught.value


def trigger_count(engine: Engine) -> int:
    """How many database triggers public.orders has."""
    return int(
        engine.value("select count(*) from pg_trigger where tgrelid = 'public.orders'::regclass")
    )


@pytest.fixture
def orders(engine: Engine) -> Engine:
    """Flow "orderFlow" (one step) with SCHEMA as its input schema, and table public.orders."""
    engine.flow("orderFlow", {"slug": "charge"})
    engine.conn.execute(
        "update pgflow.flows set input_schema = %s where flow_slug = 'orderFlow'", (Jsonb(SCHEMA),)
    )
    engine.conn.execute(ORDERS)
    return engine


def inputs(engine: Engine) -> list[Any]:
    return [r["input"] for r in engine.all("select input from pgflow.runs order by started_at")]


def test_an_insert_starts_a_run_with_the_mapped_columns_in_the_writing_transaction(
    orders: Engine,
) -> None:
    set_triggers(orders, "orderFlow", trigger(input={"order_id": "id", "total": "amount"}))
    conn = orders.conn
    with conn.transaction(force_rollback=True):
        conn.execute("insert into public.orders (amount) values (10.5)")
        assert inputs(orders) == [{"order_id": 1, "total": 10.5}]  # seen inside the transaction
    assert inputs(orders) == []
    assert orders.value("select count(*) from pgmq.q_orderFlow") == 0

    conn.execute("insert into public.orders (amount) values (3)")
    assert inputs(orders) == [{"order_id": 2, "total": 3}]
    task = orders.poll("orderFlow")
    assert [t.step_slug for t in task] == ["charge"]


def test_when_lets_through_only_the_rows_every_test_holds_for(orders: Engine) -> None:
    when = {"status": {"in": ["paid", "shipped"]}, "amount": {"gte": 100, "lt": 1000},
            "note": {"is_null": True}}  # fmt: skip
    set_triggers(orders, "orderFlow", trigger(when=when))
    rows = [("paid", 100, None), ("new", 500, None), ("shipped", 999, None),
            ("paid", 99, None), ("paid", 1000, None), ("paid", 200, "x")]  # fmt: skip
    for status, amount, note in rows:
        orders.conn.execute(
            "insert into public.orders (status, amount, note) values (%s, %s, %s)",
            (status, amount, note),
        )
    assert inputs(orders) == [{"order_id": 1}, {"order_id": 3}]


def test_an_update_trigger_fires_on_updates_and_changed_compares_the_old_row(
    orders: Engine,
) -> None:
    paid = {"status": {"eq": "paid", "changed": True}}
    set_triggers(orders, "orderFlow", trigger(on=["update"], when=paid))
    conn = orders.conn
    conn.execute("insert into public.orders (status) values ('paid'), ('new')")
    assert inputs(orders) == []  # inserts start nothing
    conn.execute("update public.orders set status = 'paid' where id = 2")
    conn.execute("update public.orders set note = 'again' where id = 2")  # paid, but unchanged
    conn.execute("update public.orders set amount = 5 where id = 1")
    assert inputs(orders) == [{"order_id": 2}]


def test_a_trigger_on_inserts_and_updates_fires_on_both(orders: Engine) -> None:
    set_triggers(orders, "orderFlow", trigger(on=["update", "insert"]))
    orders.conn.execute("insert into public.orders default values")
    orders.conn.execute("update public.orders set note = 'x'")
    assert inputs(orders) == [{"order_id": 1}, {"order_id": 1}]
    assert orders.one("select definition from pgflow.flow_triggers")["definition"]["on"] == [
        "insert",
        "update",
    ]


def test_applying_the_same_triggers_again_changes_nothing_and_locks_no_table(
    orders: Engine,
) -> None:
    first = set_triggers(orders, "orderFlow", trigger())
    assert first["created"] == ["paid"]
    assert first["summary"] == "triggers created: paid"
    oid = orders.value("select oid from pg_trigger where tgname = 'pgflow_orderFlow__paid'")

    conn = orders.conn
    with conn.transaction():
        again = set_triggers(orders, "orderFlow", trigger())
        locks = orders.value(
            "select count(*) from pg_locks where relation = 'public.orders'::regclass"
            " and pid = pg_backend_pid()"
        )
    assert again == {"created": [], "dropped": [], "replaced": [], "kept": ["paid"],
                     "summary": None}  # fmt: skip
    assert locks == 0
    assert orders.value("select oid from pg_trigger where tgname = 'pgflow_orderFlow__paid'") == oid


def test_a_changed_trigger_is_replaced_and_a_removed_one_dropped(orders: Engine) -> None:
    set_triggers(orders, "orderFlow", trigger(), trigger(name="big", when={"amount": {"gt": 10}}))
    changed = set_triggers(orders, "orderFlow", trigger(on=["update"]))
    assert changed["replaced"] == ["paid"]
    assert changed["dropped"] == ["big"]
    assert changed["summary"] == "triggers replaced: paid; triggers dropped: big"
    names = orders.all("select tgname from pg_trigger where tgrelid = 'public.orders'::regclass")
    assert names == [{"tgname": "pgflow_orderFlow__paid"}]

    orders.conn.execute("insert into public.orders (amount) values (50)")
    assert inputs(orders) == []
    assert set_triggers(orders, "orderFlow")["dropped"] == ["paid"]
    assert trigger_count(orders) == 0
    assert orders.value("select count(*) from pgflow.flow_triggers") == 0


WHERE = 'Flow "orderFlow" trigger "paid": '
REFUSALS = [
    ({"table": "public.ordres"}, "42P01", "table public.ordres does not exist."),
    ({"input": {"order_id": "order_id"}}, "42703",
     'input "order_id" takes column order_id, which table public.orders does not have.'),
    ({"input": {"order_id": "status"}}, "42804",
     'input "order_id" takes column status of public.orders, a text, but the flow\'s input'
     ' schema says "integer".'),
    ({"input": {"total": "amount"}}, "22023",
     'the flow\'s input requires key "order_id", which "input" does not map.'),
    ({"when": {"statuz": {"eq": "paid"}}}, "42703",
     '"when" tests column statuz, which table public.orders does not have.'),
    ({"when": {"status": {"changed": True}}}, "22023",
     '"when" tests whether column status changed, which only an update can say.'),
    ({"when": {"status": {"like": "p%"}}}, "22023",
     '"when" cannot test column status with like "p%".'),
    ({"when": {"amount": {"gt": "lots"}}}, "22P02",
     'table public.orders cannot take it: invalid input syntax for type numeric: "lots"'),
    ({"on": ["delete"]}, "22023", '"on" must list insert, update or both, got ["delete"].'),
    ({"onError": "ignore"}, "22023", '"onError" must be raise or skip, got "ignore".'),
    ({"columns": ["id"]}, "22023", 'unknown key "columns".'),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "sqlstate", "message"), REFUSALS)
def test_a_trigger_that_cannot_work_is_refused_with_where_and_why(
    orders: Engine, fields: dict[str, Any], sqlstate: str, message: str
) -> None:
    set_triggers(orders, "orderFlow", trigger(name="kept"))
    error = refusal(orders, "orderFlow", trigger(name="kept"), trigger(**fields))
    assert (error.sqlstate, error.diag.message_primary) == (sqlstate, WHERE + message)
    # Nothing changed: the trigger there before is still there, alone.
    assert orders.value("select array_agg(trigger_name) from pgflow.flow_triggers") == ["kept"]
    assert trigger_count(orders) == 1


def test_a_trigger_needs_a_name_of_its_own_and_a_flow_that_exists(orders: Engine) -> None:
    error = refusal(orders, "orderFlow", trigger(name="9lives"))
    assert (error.sqlstate, error.diag.message_primary) == (
        "22023",
        'Flow "orderFlow": a trigger\'s name must be a letter, then letters, digits or _ (at most'
        ' 40 in all), got "9lives".',
    )
    error = refusal(orders, "orderFlow", trigger(), trigger(on=["update"]))
    assert (error.sqlstate, error.diag.message_primary) == (
        "22023", 'Flow "orderFlow" has two triggers named "paid".')  # fmt: skip
    error = refusal(orders, "nope", trigger())
    assert (error.sqlstate, error.diag.message_primary) == ("P0002", 'Flow "nope" does not exist.')


def test_a_flow_without_an_input_schema_takes_any_columns(orders: Engine) -> None:
    orders.flow("loose", {"slug": "only"})
    set_triggers(orders, "loose", trigger(input={"s": "status", "n": "note"}))
    orders.conn.execute("insert into public.orders default values")
    assert inputs(orders) == [{"s": "new", "n": None}]


def test_on_error_raise_aborts_the_write_and_skip_keeps_the_write_and_logs_the_start(
    orders: Engine,
) -> None:
    # A root map step needs an array input: a start with the row's object fails.
    orders.flow("mapper", {"slug": "each", "step_type": "map"})
    set_triggers(orders, "mapper", trigger())
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        orders.conn.execute("insert into public.orders default values")
    assert "must be a JSON array" in str(caught.value)
    assert orders.value("select count(*) from public.orders") == 0

    set_triggers(orders, "mapper", trigger(onError="skip"))
    orders.conn.execute("insert into public.orders (status) values ('kept')")
    assert orders.value("select status from public.orders") == "kept"
    skip = orders.one("select * from pgflow.trigger_skips")
    assert (skip["flow_slug"], skip["trigger_name"], skip["table_name"], skip["operation"],
            skip["input"], skip["sqlstate"]) == (
        "mapper", "paid", "public.orders", "INSERT", {"order_id": 2}, "22023")  # fmt: skip
    assert "must be a JSON array" in skip["message"]
    assert orders.value("select count(*) from pgflow.runs") == 0


def test_deleting_the_flow_drops_its_triggers_and_a_local_recompile_keeps_them(
    orders: Engine,
) -> None:
    orders.compile("compiled", [{"slug": "a"}], mode="flow")
    set_triggers(orders, "compiled", trigger(input={"id": "id"}))
    orders.conn.execute("set pgflow.local = on")
    assert orders.compile("compiled", [{"slug": "a"}, {"slug": "b"}], mode="flow")["status"] == (
        "recompiled"
    )
    orders.conn.execute("insert into public.orders default values")
    assert inputs(orders) == [{"id": 1}]

    orders.call("delete_flow_and_data", "compiled")
    assert trigger_count(orders) == 0
    assert orders.value("select count(*) from pgflow.flow_triggers") == 0
    orders.conn.execute("insert into public.orders default values")
    assert orders.value("select count(*) from public.orders") == 2


def test_a_database_trigger_without_its_row_starts_nothing_and_warns(orders: Engine) -> None:
    set_triggers(orders, "orderFlow", trigger())
    orders.conn.execute("delete from pgflow.flow_triggers")
    warnings: list[str] = []
    orders.conn.add_notice_handler(lambda d: warnings.append(d.message_primary or ""))
    orders.conn.execute("insert into public.orders default values")
    assert inputs(orders) == []
    assert warnings == [
        'Trigger pgflow_orderFlow__paid on public.orders starts no run: flow "orderFlow" has no'
        ' trigger "paid" on this table.'
    ]


def test_a_long_flow_slug_gets_a_hashed_trigger_name(orders: Engine) -> None:
    slug = "f" * 40
    orders.flow(slug, {"slug": "only"})
    set_triggers(orders, slug, trigger(name="a_long_trigger_name", input={"id": "id"}))
    name = orders.value("select pg_trigger_name from pgflow.flow_triggers")
    assert name.startswith("pgflow_")
    assert len(name) == 31
    orders.conn.execute("insert into public.orders default values")
    assert inputs(orders) == [{"id": 1}]


def test_prune_deletes_old_skips(orders: Engine) -> None:
    orders.conn.execute(
        "insert into pgflow.trigger_skips (flow_slug, trigger_name, table_name, operation,"
        " sqlstate, message, skipped_at) values ('f', 't', 'orders', 'INSERT', '22023', 'm',"
        " now() - interval '2 days'), ('f', 't', 'orders', 'INSERT', '22023', 'm', now())"
    )
    orders.call("prune_data_older_than", "1 day")
    assert orders.value("select count(*) from pgflow.trigger_skips") == 1


def test_a_table_needs_its_schema(orders: Engine) -> None:
    error = refusal(orders, "orderFlow", trigger(table="orders"))
    assert (error.sqlstate, error.diag.message_primary) == (
        "22023",
        'Flow "orderFlow" trigger "paid": table orders must be given as schema.table.',
    )


def test_a_partitioned_table_starts_runs_from_each_partition(orders: Engine) -> None:
    orders.conn.execute(
        "create table public.events (id int, region text, note text) partition by list (region);"
        " create table public.events_eu partition of public.events for values in ('eu');"
        " create table public.events_us partition of public.events for values in ('us')"
    )
    set_triggers(orders, "orderFlow", trigger(table="public.events", when={"note": {"ne": "x"}}))
    orders.conn.execute(
        "insert into public.events values (1, 'eu', 'a'), (2, 'us', 'b'), (3, 'us', 'x')"
    )
    assert sorted(r["order_id"] for r in inputs(orders)) == [1, 2]
    assert set_triggers(orders, "orderFlow")["dropped"] == ["paid"]
    assert (
        orders.value(
            "select count(*) from pg_trigger where tgfoid = 'pgflow._table_trigger'::regproc"
        )
        == 0
    )


def test_no_code_of_a_tables_owner_runs_as_the_engines_owner(
    orders: Engine, logins: Logins
) -> None:
    # The table's owner (no superuser) owns a type whose cast to json would run its own code.
    owner = logins.create_login(f"{logins.prefix}_owner")
    orders.conn.execute(f"grant create on schema public to {owner}")
    conn = logins.connect(owner)
    conn.execute(
        "create table public.seen (who text);"
        " create type public.mood as enum ('happy', 'sad');"
        " create function public.mood_json(public.mood) returns json language sql"
        " as $$ insert into public.seen values (current_user) returning to_json($1::text) $$;"
        " create cast (public.mood as json) with function public.mood_json(public.mood);"
        " create table public.moods (id int, mood public.mood, other public.mood)"
    )
    try:
        orders.flow("loose", {"slug": "only"})  # no input schema: any column fits
        mapped = trigger(table="public.moods", input={"id": "id", "mood": "mood"})
        set_triggers(orders, "loose", mapped)
        # It reads only the mapped columns, and one of a type it does not ship as text.
        conn.execute("insert into public.moods values (1, 'happy', 'sad')")
        assert inputs(orders) == [{"id": 1, "mood": "happy"}]
        assert orders.value("select count(*) from public.seen") == 0
    finally:
        orders.conn.execute("drop cast (public.mood as json)")


def test_a_mapped_column_that_is_gone_fails_the_start_and_never_becomes_null(
    orders: Engine,
) -> None:
    set_triggers(orders, "orderFlow", trigger(input={"order_id": "id", "total": "amount"}))
    orders.conn.execute("alter table public.orders rename column amount to price")
    with pytest.raises(psycopg.errors.UndefinedColumn) as caught:
        orders.conn.execute("insert into public.orders default values")
    assert caught.value.diag.message_primary == (
        'Flow "orderFlow" trigger "paid": table public.orders has no column amount any more.'
    )
    # With skip, the write goes on and the start is logged (input none: it could not be made).
    price = {"order_id": "id", "total": "price"}
    set_triggers(orders, "orderFlow", trigger(input=price, onError="skip"))
    orders.conn.execute("alter table public.orders rename column price to amount")
    orders.conn.execute("insert into public.orders default values")
    assert inputs(orders) == []
    skips = orders.all("select trigger_name, sqlstate, input, message from pgflow.trigger_skips")
    assert skips == [
        {"trigger_name": "paid", "sqlstate": "42703", "input": None,
         "message": 'Flow "orderFlow" trigger "paid": table public.orders has no column price'
                    " any more."},
    ]  # fmt: skip
    assert orders.value("select count(*) from public.orders") == 1


def test_two_flows_triggers_never_share_a_database_name(orders: Engine) -> None:
    orders.flow("f1", {"slug": "a"})
    orders.flow("f1_x", {"slug": "a"})
    set_triggers(orders, "f1", trigger(name="x_y", input={"id": "id"}))
    set_triggers(orders, "f1_x", trigger(name="y", input={"id": "id"}))
    orders.conn.execute("insert into public.orders default values")
    assert sorted(r["flow_slug"] for r in orders.all("select flow_slug from pgflow.runs")) == [
        "f1",
        "f1_x",
    ]


def test_a_trigger_renamed_by_hand_is_still_the_one(orders: Engine) -> None:
    set_triggers(orders, "orderFlow", trigger())
    orders.conn.execute('alter trigger "pgflow_orderFlow__paid" on public.orders rename to mine')
    assert set_triggers(orders, "orderFlow", trigger())["kept"] == ["paid"]
    orders.conn.execute("insert into public.orders default values")
    assert len(inputs(orders)) == 1
    assert set_triggers(orders, "orderFlow")["dropped"] == ["paid"]
    assert trigger_count(orders) == 0

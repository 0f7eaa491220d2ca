"""A comparable snapshot of everything the engine defines in schema `pgflow`: what the source
files and the migrations must build alike (tests/migrations), and what the migration writer
compares (`pgflow_gen.runtime.sql.writer`)."""

from __future__ import annotations

from typing import Any, LiteralString

import psycopg

QUERIES: dict[str, LiteralString] = {
    "columns": """
        select table_name, column_name, data_type, domain_schema, domain_name, is_nullable,
          column_default, ordinal_position
        from information_schema.columns where table_schema = 'pgflow'
        order by table_name, ordinal_position""",
    "domains": """
        select t.typname, format_type(t.typbasetype, t.typtypmod), t.typnotnull, t.typdefault
        from pg_type t where t.typnamespace = 'pgflow'::regnamespace and t.typtype = 'd'
        order by 1""",
    "constraints": """
        select conrelid::regclass::text, contypid::regtype::text, conname,
          pg_get_constraintdef(oid)
        from pg_constraint where connamespace = 'pgflow'::regnamespace
        order by 1, 2, 3""",
    "indexes": """
        select tablename, indexname, indexdef from pg_indexes
        where schemaname = 'pgflow' order by 1, 2""",
    "functions": """
        select p.oid::regprocedure::text, pg_get_functiondef(p.oid), p.proacl::text
        from pg_proc p where p.pronamespace = 'pgflow'::regnamespace
        order by 1""",
    "triggers": """
        select t.tgrelid::regclass::text, t.tgname, pg_get_triggerdef(t.oid)
        from pg_trigger t join pg_class c on c.oid = t.tgrelid
        where c.relnamespace = 'pgflow'::regnamespace and not t.tgisinternal
        order by 1, 2""",
    "types": """
        select t.typname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnum
        from pg_type t join pg_attribute a on a.attrelid = t.typrelid
        where t.typnamespace = 'pgflow'::regnamespace and t.typtype = 'c'
          and not exists (select 1 from pg_class c where c.oid = t.typrelid and c.relkind <> 'c')
        order by 1, 4""",
}


def snapshot(url: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(url) as conn:
        return {name: conn.execute(query).fetchall() for name, query in QUERIES.items()}

-- The table PGMQ keeps a queue's messages in (kind 'q') or its archive (kind 'a'), in schema
-- pgmq: lower(kind || '_' || queue_name), as PGMQ names them. The one place in SQL that spells
-- it (pgflow_gen.naming.pgmq_table is its Python twin); every function that reaches a queue's
-- table by name calls it. Pure.
create function pgflow.pgmq_table_name(queue_name text, kind text default 'q')
returns text
language sql
immutable
parallel safe
set search_path = ''
return lower(kind || '_' || queue_name);

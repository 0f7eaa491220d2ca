-- The type of column column_name of table relid (null when it has none, or a dropped one).
-- For table triggers (engine 0032). No writes.
create function pgflow._column_type(relid oid, column_name text)
returns oid
language sql
stable
set search_path = ''
as $$
  select a.atttypid from pg_catalog.pg_attribute as a
  where a.attrelid = relid and a.attname = column_name and a.attnum > 0 and not a.attisdropped;
$$;

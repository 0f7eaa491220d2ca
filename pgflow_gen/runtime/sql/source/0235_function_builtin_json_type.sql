-- Whether to_jsonb turns values of type type_oid into JSON with PostgreSQL's own code alone
-- (engine 0032): the type, under its domains and array levels, is one PostgreSQL ships
-- (an oid below 16384, FirstNormalObjectId). For any other type to_jsonb calls a cast to json
-- that the type's owner may have made; pgflow._table_trigger, which runs as the engine's
-- owner, must never call such code, so it turns those values into text with the type's output
-- function instead (which only a superuser can write). No writes.
create function pgflow._builtin_json_type(type_oid oid)
returns boolean
language sql
stable
set search_path = ''
as $$
  with recursive under (oid, depth) as (
    select type_oid, 0
    union all
    select case when t.typtype = 'd' then t.typbasetype else t.typelem end, u.depth + 1
    from under as u
    join pg_catalog.pg_type as t on t.oid = u.oid
    where (t.typtype = 'd' or (t.typcategory = 'A' and t.typelem <> 0)) and u.depth < 32
  )
  select coalesce(bool_and(u.oid < 16384), false)
  from under as u
  join pg_catalog.pg_type as t on t.oid = u.oid
  where not (t.typtype = 'd' or (t.typcategory = 'A' and t.typelem <> 0));
$$;

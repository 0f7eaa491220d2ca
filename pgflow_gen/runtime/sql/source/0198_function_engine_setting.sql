-- One of the engine's settings (a pgflow.* parameter) as this session must see it (engine 0020):
-- for an operator (pgflow._session_is_operator) the session's value, which follows ALTER DATABASE
-- / ALTER ROLE ... SET unless the session set its own; for anyone else the value set for the
-- database (ALTER DATABASE ... SET, pg_db_role_setting), whatever the session set, so a worker
-- cannot shorten the stall rule and take live workers' tasks. Null when unset. No writes.
create function pgflow._engine_setting(name text)
returns text
language sql
stable
set search_path = ''
as $$
  select case when pgflow._session_is_operator() then pg_catalog.current_setting(name, true)
    else (
      select substr(c.setting, length(name) + 2)
      from pg_catalog.pg_db_role_setting as s
      cross join lateral unnest(s.setconfig) as c (setting)
      where s.setrole = 0
        and s.setdatabase = (select d.oid from pg_catalog.pg_database as d where d.datname = current_database())
        and c.setting like name || '=%'
      limit 1
    )
  end
$$;

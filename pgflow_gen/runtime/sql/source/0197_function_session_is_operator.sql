-- Whether this session's login role (session_user) may set the engine's rules for itself (engine
-- 0020): a superuser, the engine's owner, or a member of the admin role `pgflow-gen db roles`
-- recorded (pgflow.engine_roles). Everyone else (workers, step roles, clients, readers) gets
-- the database's settings, never its own session's: see pgflow._database_setting. No writes.
create function pgflow._session_is_operator()
returns boolean
language sql
stable
set search_path = ''
as $$
  select exists (select 1 from pg_catalog.pg_roles as u where u.rolname = session_user and u.rolsuper)
    or session_user = (
      select pg_catalog.pg_get_userbyid(n.nspowner) from pg_catalog.pg_namespace as n
      where n.nspname = 'pgflow'
    )
    or exists (
      select 1 from pgflow.engine_roles as e
      join pg_catalog.pg_roles as g on g.rolname = e.role_name
      where e.kind = 'admin' and pg_catalog.pg_has_role(session_user, g.oid, 'MEMBER')
    )
$$;

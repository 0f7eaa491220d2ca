-- The pgflow.step_roles rows that bind this session (engine 0020): those of the step roles its
-- login role (session_user, which security definer functions and SET ROLE leave as it is) is or
-- belongs to, directly or through other roles (pg_has_role MEMBER, so a role made `in role` a step
-- role is held to that step too). None for a superuser (PostgreSQL counts one a member of every
-- role) or for the engine's owner. A row whose role was dropped binds nobody. No writes.
create function pgflow._session_step_roles()
returns setof pgflow.step_roles
language sql
stable
set search_path = ''
as $$
  select r.* from pgflow.step_roles as r
  join pg_catalog.pg_roles as g on g.rolname = r.role_name
  where pg_catalog.pg_has_role(session_user, g.oid, 'MEMBER')
    and not exists (
      select 1 from pg_catalog.pg_roles as u where u.rolname = session_user and u.rolsuper
    )
    and session_user <> (
      select pg_catalog.pg_get_userbyid(n.nspowner) from pg_catalog.pg_namespace as n
      where n.nspname = 'pgflow'
    )
$$;

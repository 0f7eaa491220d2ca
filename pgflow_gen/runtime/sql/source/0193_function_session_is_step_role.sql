-- Whether this session's login role (session_user, which security definer functions and SET ROLE
-- leave as it is) is a step role of pgflow.step_roles (engine 0019): one index probe. The one
-- statement of the rule, for pgflow._require_step_route and the other checks. No writes.
create function pgflow._session_is_step_role()
returns boolean
language sql
stable
set search_path = ''
as $$
  select exists (select 1 from pgflow.step_roles as r where r.role_name = session_user)
$$;

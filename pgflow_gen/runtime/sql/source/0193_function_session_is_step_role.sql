-- Whether this session is bound by a step role (pgflow._session_step_roles; engine 0020: by role
-- membership). Without any step role in the database, one probe of an empty table. The one
-- statement of the rule, for pgflow._require_step_route and the other checks. No writes.
create function pgflow._session_is_step_role()
returns boolean
language plpgsql
stable
set search_path = ''
as $$
begin
  return exists (select 1 from pgflow.step_roles)
    and exists (select 1 from pgflow._session_step_roles());
end;
$$;

-- Refuses (SQLSTATE 42501) a session bound by a step role (pgflow._session_step_roles) when the
-- step route it works on is not its own; a null step (a flow-mode claim) is no step role's route.
-- Other sessions pass after one index probe. Called by the claims (pgflow._claim_route),
-- register_worker and the other pgflow._require_* checks. No writes, no locks.
create function pgflow._require_step_route(flow_slug text, step_slug text)
returns void
language plpgsql
stable
set search_path = ''
as $$
declare
  v_routes text;
begin
  if not pgflow._session_is_step_role() then
    return;
  end if;
  if exists (
    select 1 from pgflow._session_step_roles() as r
    where r.flow_slug = _require_step_route.flow_slug and r.step_slug = _require_step_route.step_slug
  ) then
    return;
  end if;
  select string_agg(format('step "%s" of flow "%s"', r.step_slug, r.flow_slug), ', ' order by r.flow_slug, r.step_slug)
  into v_routes from pgflow._session_step_roles() as r;
  raise exception 'Role "%" may not work on step "%" of flow "%".', session_user, coalesce(step_slug, '(any)'), flow_slug
    using errcode = '42501', detail = format('It is the role of %s only.', v_routes),
      hint = 'Run each step''s worker with that step''s own role (pgflow-gen db roles --per-step).';
end;
$$;

-- Refuses (SQLSTATE 42501) a session bound by a step role (pgflow._session_step_roles) that has no
-- route among the steps that exist: in the given flow, or with a null flow in any flow (engine
-- 0020: a step role whose flow was deleted, or recompiled without its step, is refused everywhere
-- and never works as a plain worker). Called by the functions a worker calls for no one step:
-- requeue_stalled_tasks (any flow), start_scheduled_runs (its flow). Other sessions pass after
-- one probe. No writes, no locks.
create function pgflow._require_flow_route(flow_slug text)
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
    join pgflow.steps as s on s.flow_slug = r.flow_slug and s.step_slug = r.step_slug
    where _require_flow_route.flow_slug is null or r.flow_slug = _require_flow_route.flow_slug
  ) then
    return;
  end if;
  select string_agg(format('step "%s" of flow "%s"', r.step_slug, r.flow_slug), ', ' order by r.flow_slug, r.step_slug)
  into v_routes from pgflow._session_step_roles() as r;
  if flow_slug is null then
    raise exception 'Role "%" is bound to a step that does not exist.', session_user
      using errcode = '42501', detail = format('It is the role of %s only.', v_routes),
        hint = 'Apply the flow''s migration again (its step roles work again for their steps), or drop the role.';
  end if;
  raise exception 'Role "%" may not work on flow "%".', session_user, flow_slug
    using errcode = '42501', detail = format('It is the role of %s only.', v_routes),
      hint = 'Run each step''s worker with that step''s own role (pgflow-gen db roles --per-step).';
end;
$$;

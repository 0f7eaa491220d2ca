-- Refuses (SQLSTATE 42501) a step role's session that reports on, renews or reads a task of another
-- step (pgflow._require_step_route on the first such task; an unknown run counts as another step's).
-- Other sessions pass after one index probe. Called by complete_task, fail_task, complete_tasks,
-- renew_task_leases. No writes, no locks.
create function pgflow._require_task_routes(run_ids uuid[], step_slugs text[])
returns void
language plpgsql
stable
set search_path = ''
as $$
declare
  v_other record;
begin
  if not pgflow._session_is_step_role() then
    return;
  end if;
  select coalesce(r.flow_slug, '(unknown run)') as flow_slug, k.step_slug into v_other
  from unnest(run_ids, step_slugs) as k (run_id, step_slug)
  left join pgflow.runs as r on r.run_id = k.run_id
  where not exists (
    select 1 from pgflow._session_step_roles() as sr
    where sr.flow_slug = r.flow_slug and sr.step_slug = k.step_slug
  )
  limit 1;
  if found then
    perform pgflow._require_step_route(v_other.flow_slug, v_other.step_slug);
  end if;
end;
$$;

-- The given runs that are cancelled (engine 0020), for a worker to confirm a run:cancelled
-- notification before it stops the run's handlers: PostgreSQL has no privilege on NOTIFY, so
-- any role that can connect can send one, and a notification is a hint, never an order. A step
-- role (pgflow._session_step_roles) hears only of runs with a task of its own step. No writes,
-- no locks.
create function pgflow.cancelled_runs(run_ids uuid[])
returns setof uuid
language plpgsql
stable
security definer
set search_path = ''
as $$
declare
  v_step_role boolean := pgflow._session_is_step_role();
begin
  return query
    select r.run_id from pgflow.runs as r
    where r.run_id = any (run_ids) and r.status = 'cancelled'
      and (
        not v_step_role
        or exists (
          select 1 from pgflow.step_tasks as t
          join pgflow._session_step_roles() as sr on sr.flow_slug = t.flow_slug and sr.step_slug = t.step_slug
          where t.run_id = r.run_id
        )
      );
end;
$$;

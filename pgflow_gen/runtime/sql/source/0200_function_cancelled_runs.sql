-- The given runs that are cancelled (engine 0020), for a worker to confirm a run:cancelled
-- notification before it stops the run's handlers: PostgreSQL has no privilege on NOTIFY, so
-- any role that can connect can send one, and a notification is a hint, never an order. A step
-- role hears only of runs with a task of its own step (pgflow._session_sees_run). No writes,
-- no locks.
create function pgflow.cancelled_runs(run_ids uuid[])
returns setof uuid
language plpgsql
stable
security definer
set search_path = ''
as $$
begin
  return query
    select r.run_id from pgflow.runs as r
    where r.run_id = any (run_ids) and r.status = 'cancelled' and pgflow._session_sees_run(r.run_id);
end;
$$;

-- A run's input (null for an unknown run), for ctx.flow_input() of tasks that do not carry it
-- (engine 0019: workers read no table). A step role reads only the input of a run with a task of
-- its own step (pgflow._session_sees_run; SQLSTATE 42501 otherwise). No writes, no locks.
create function pgflow.run_input(run_id uuid)
returns jsonb
language plpgsql
stable
security definer
set search_path = ''
as $$
begin
  if not pgflow._session_sees_run(run_id) then
    raise exception 'Role "%" may not read the input of run %.', session_user, run_id
      using errcode = '42501', detail = 'A step''s role reads the input of runs with a task of its step only.';
  end if;
  return (select r.input from pgflow.runs as r where r.run_id = run_input.run_id);
end;
$$;

-- Whether this session may hear of a run (engine 0020): any session but one bound by a step role
-- (pgflow._session_step_roles), which sees only the runs with a task of its own step. The one
-- statement of the rule, for run_input, run_trace_contexts and cancelled_runs. No writes.
create function pgflow._session_sees_run(run_id uuid)
returns boolean
language plpgsql
stable
set search_path = ''
as $$
begin
  return not pgflow._session_is_step_role()
    or exists (
      select 1 from pgflow.step_tasks as t
      join pgflow._session_step_roles() as sr on sr.flow_slug = t.flow_slug and sr.step_slug = t.step_slug
      where t.run_id = _session_sees_run.run_id
    );
end;
$$;

-- Each given run's id and the trace context it was started in (engine 0016's runs.traceparent),
-- for the workers' tracing spans (engine 0019: workers read no table). A step role
-- (pgflow._session_step_roles; engine 0020) gets only the runs with a task of its own step. No
-- writes, no locks.
create function pgflow.run_trace_contexts(run_ids uuid[])
returns table (run_id uuid, traceparent text)
language plpgsql
stable
security definer
set search_path = ''
as $$
begin
  if not pgflow._session_is_step_role() then
    return query select r.run_id, r.traceparent from pgflow.runs as r where r.run_id = any (run_ids);
    return;
  end if;
  return query
    select r.run_id, r.traceparent from pgflow.runs as r
    where r.run_id = any (run_ids)
      and exists (
        select 1 from pgflow.step_tasks as t
        join pgflow._session_step_roles() as sr on sr.flow_slug = t.flow_slug and sr.step_slug = t.step_slug
        where t.run_id = r.run_id
      );
end;
$$;

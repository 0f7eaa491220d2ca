-- Each given run's id and the trace context it was started in (engine 0016's runs.traceparent),
-- for the workers' tracing spans (engine 0019: workers read no table). A step role gets only the
-- runs with a task of its own step (pgflow._session_sees_run, engine 0020). No writes, no locks.
create function pgflow.run_trace_contexts(run_ids uuid[])
returns table (run_id uuid, traceparent text)
language plpgsql
stable
security definer
set search_path = ''
as $$
begin
  return query
    select r.run_id, r.traceparent from pgflow.runs as r
    where r.run_id = any (run_ids) and pgflow._session_sees_run(r.run_id);
end;
$$;

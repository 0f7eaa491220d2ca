-- Refuses (SQLSTATE 42501) a step role's session that heartbeats or stops a worker registered for
-- another step; an unknown worker passes (the caller says so itself). Other sessions pass after
-- one index probe. Called by heartbeat_worker and mark_worker_stopped. No writes, no locks.
create function pgflow._require_worker_route(worker_id uuid)
returns void
language plpgsql
stable
set search_path = ''
as $$
declare
  v_worker record;
begin
  if not pgflow._session_is_step_role() then
    return;
  end if;
  select w.flow_slug, w.step_slug into v_worker
  from pgflow.workers as w where w.worker_id = _require_worker_route.worker_id;
  if found then
    perform pgflow._require_step_route(v_worker.flow_slug, v_worker.step_slug);
  end if;
end;
$$;

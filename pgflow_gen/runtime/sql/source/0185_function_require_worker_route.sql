-- Refuses (SQLSTATE 42501) a session that heartbeats or stops a worker it did not register
-- (engine 0020: workers.registered_by is another login role; an operator, see
-- pgflow._session_is_operator, may), and a step role's session on a worker registered for another
-- step. An unknown worker passes (the caller says so itself). One index probe of the worker.
-- Called by heartbeat_worker and mark_worker_stopped. No writes, no locks.
create function pgflow._require_worker_route(worker_id uuid)
returns void
language plpgsql
stable
set search_path = ''
as $$
declare
  v_worker record;
begin
  select w.flow_slug, w.step_slug, w.registered_by into v_worker
  from pgflow.workers as w where w.worker_id = _require_worker_route.worker_id;
  if not found then
    return;
  end if;
  perform pgflow._require_worker_owner(worker_id, v_worker.registered_by);
  if pgflow._session_is_step_role() then
    perform pgflow._require_step_route(v_worker.flow_slug, v_worker.step_slug);
  end if;
end;
$$;

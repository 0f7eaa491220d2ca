-- Refuses (SQLSTATE 42501) a session whose login role did not register the worker id it acts as
-- (engine 0020): `registered_by` is the worker's row's; null (a worker registered before 0020)
-- and the session's own login role pass at once, an operator (pgflow._session_is_operator) too.
-- Called by register_worker, the claims (pgflow._claim_messages) and _require_worker_route. No
-- writes, no locks.
create function pgflow._require_worker_owner(worker_id uuid, registered_by text)
returns void
language plpgsql
stable
set search_path = ''
as $$
begin
  if registered_by is null or registered_by = session_user or pgflow._session_is_operator() then
    return;
  end if;
  raise exception 'Worker % belongs to role "%"; role "%" may not act as it.', worker_id, registered_by, session_user
    using errcode = '42501', hint = 'Each worker process registers its own worker id (a new UUID) under its own role.';
end;
$$;

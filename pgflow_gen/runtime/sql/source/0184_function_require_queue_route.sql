-- Refuses a queue that is no engine queue (SQLSTATE 42501: the functions that take a queue name
-- must not reach an application's own PGMQ queues), and a step role's session on a queue that is
-- not its step's. Called by set_vt_batch and enable_insert_notifications. No writes, no locks.
create function pgflow._require_queue_route(queue_name text)
returns void
language plpgsql
stable
set search_path = ''
as $$
declare
  v_queue text := lower(queue_name);
begin
  if not exists (select 1 from pgflow.steps as s where s.queue_name = v_queue)
    and not exists (select 1 from pgflow.flows as f where pgflow.default_queue_name(f.flow_slug) = v_queue) then
    raise exception 'Queue "%" is not a queue of the engine''s flows.', v_queue
      using errcode = '42501', hint = 'Only the queues of the flows in pgflow.flows may be named here.';
  end if;
  if pgflow._session_is_step_role()
    and not exists (
      select 1 from pgflow._session_step_roles() as r
      join pgflow.steps as s on s.flow_slug = r.flow_slug and s.step_slug = r.step_slug
      where s.queue_name = v_queue
    ) then
    raise exception 'Role "%" may not work on queue "%".', session_user, v_queue
      using errcode = '42501', hint = 'Run each step''s worker with that step''s own role (pgflow-gen db roles --per-step).';
  end if;
end;
$$;

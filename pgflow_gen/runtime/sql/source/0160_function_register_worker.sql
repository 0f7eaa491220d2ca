-- A worker process announces itself and the one queue it polls (and, for a step worker, its flow
-- and step). Re-registering the same worker id refreshes it. Called once at worker startup. A step
-- role (pgflow._session_step_roles) registers only for its own step and that step's queue.
-- Registers only real routes (engine 0020): the queue is an engine queue; with a flow, the flow
-- exists and the queue is its default queue or one of its steps' (with a step, that step's own);
-- a step needs its flow; the function name is at most 200 characters. The worker id belongs to the
-- login role that registered it first (workers.registered_by): another role is refused
-- (pgflow._require_worker_owner). Locks the worker's row.
create function pgflow.register_worker(
  worker_id uuid,
  queue_name text,
  function_name text,
  flow_slug text default null,
  step_slug text default null
)
returns pgflow.workers
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_worker pgflow.workers;
  v_queue text := lower(queue_name);
  v_owner text;
begin
  perform pgflow._require_step_route(flow_slug, step_slug);
  perform pgflow._require_queue_route(queue_name);
  if char_length(function_name) > 200 then
    raise exception 'A worker''s function name has at most 200 characters, not %.', char_length(function_name)
      using errcode = '22001';
  end if;
  if step_slug is not null and flow_slug is null then
    raise exception 'A worker of step "%" needs its flow.', step_slug using errcode = '22023';
  end if;
  if flow_slug is not null then
    if not exists (select 1 from pgflow.flows as f where f.flow_slug = register_worker.flow_slug) then
      raise exception 'Flow "%" does not exist.', flow_slug
        using errcode = 'P0002', hint = 'Apply the flow''s migration (pgflow-gen db apply) before its workers start.';
    end if;
    if not exists (
      select 1 from pgflow.steps as s
      where s.flow_slug = register_worker.flow_slug and s.queue_name = v_queue
        and (register_worker.step_slug is null or s.step_slug = register_worker.step_slug)
    ) and not (step_slug is null and v_queue = pgflow.default_queue_name(flow_slug)) then
      raise exception 'Flow "%" has no route % on queue "%".', flow_slug,
        coalesce(format('for step "%s"', step_slug), 'for its steps'), v_queue
        using errcode = '22023', hint = 'Register the queue the flow routes the worker''s steps to.';
    end if;
  end if;
  select w.registered_by into v_owner from pgflow.workers as w
  where w.worker_id = register_worker.worker_id for update;
  if found then
    perform pgflow._require_worker_owner(worker_id, v_owner);
  end if;
  insert into pgflow.workers as w (worker_id, queue_name, function_name, flow_slug, step_slug, registered_by)
  values (register_worker.worker_id, register_worker.queue_name, register_worker.function_name,
    register_worker.flow_slug, register_worker.step_slug, session_user)
  on conflict on constraint workers_pkey do update
  set queue_name = excluded.queue_name, function_name = excluded.function_name,
    flow_slug = excluded.flow_slug, step_slug = excluded.step_slug,
    last_heartbeat_at = clock_timestamp(), stopped_at = null, registered_by = excluded.registered_by
  returning w.* into v_worker;
  return v_worker;
end;
$$;

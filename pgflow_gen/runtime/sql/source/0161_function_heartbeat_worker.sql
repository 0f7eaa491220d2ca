-- Refreshes a worker's heartbeat and tells it whether an operator deprecated it (then it stops
-- polling and drains). Raises for an unknown worker id. Called every few seconds by each worker.
create function pgflow.heartbeat_worker(worker_id uuid)
returns boolean
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_deprecated boolean;
begin
  perform pgflow._require_worker_route(worker_id);
  update pgflow.workers as w set last_heartbeat_at = clock_timestamp()
  where w.worker_id = heartbeat_worker.worker_id
  returning w.deprecated_at is not null into v_deprecated;
  if not found then
    raise exception 'Worker % is not registered.', worker_id
      using errcode = 'P0002', hint = 'Register it with pgflow.register_worker() first.';
  end if;
  return v_deprecated;
end;
$$;

-- Worker processes: each polls exactly one queue. Heartbeats keep last_heartbeat_at fresh;
-- an operator sets deprecated_at to make a worker drain and stop. registered_by is the login role
-- that registered the worker id (engine 0020; null for one registered before): only that role (or
-- an operator) heartbeats, stops, claims or registers again as this worker.
create table pgflow.workers (
  worker_id uuid primary key,
  queue_name text not null,
  flow_slug text,
  step_slug text,
  function_name text not null,
  started_at timestamptz not null default now(),
  last_heartbeat_at timestamptz not null default now(),
  stopped_at timestamptz,
  deprecated_at timestamptz,
  registered_by text
);

create index workers_queue_name_idx on pgflow.workers (queue_name);
create index workers_last_heartbeat_at_idx on pgflow.workers (last_heartbeat_at);

-- Run and step events on the channel pgflow_run_<run id without dashes>. The payload names the
-- transition only, never an output, so it always fits NOTIFY's 8000-byte limit.
-- PL/pgSQL rather than SQL so that its plan is cached (it runs on every transition).
create function pgflow._emit_event(run_id uuid, event text, step_slug text, status text)
returns void
language plpgsql
volatile
set search_path = ''
as $$
begin
  perform pg_notify(
    'pgflow_run_' || replace(run_id::text, '-', ''),
    json_build_object('event', event, 'run_id', run_id, 'step_slug', step_slug, 'status', status)::text
  );
end;
$$;

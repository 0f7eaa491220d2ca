-- Starts the runs of the debounced bursts that are due (engine 0030), at most 100 a call, the
-- longest due first; a burst another caller is starting is skipped (skip locked), so schedulers
-- that race start each run once. Called by the workers' elected scheduler on every tick. Returns
-- each burst started, with its run. Takes no clock from the caller: nothing starts early. A step
-- role without a route is refused, as for requeue_stalled_tasks.
create function pgflow.start_debounced_runs()
returns table (flow_slug text, debounce_key text, starts int, run_id uuid)
language plpgsql
volatile
security definer
set search_path = ''
as $$
begin
  perform pgflow._require_flow_route(null);
  return query select * from pgflow._start_debounced_runs(clock_timestamp());
end;
$$;

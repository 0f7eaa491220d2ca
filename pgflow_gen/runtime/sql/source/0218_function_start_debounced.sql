-- Starts the run of a debounced burst (engine 0030): a run of its flow with the burst's last
-- input and the idempotency key "debounce:<key>:<first start's time in UTC>", so the burst's run
-- is one run however it is reached. The caller has deleted the burst's row. Returns the run.
create function pgflow._start_debounced(burst pgflow.debounced_starts)
returns pgflow.runs
language sql
volatile
set search_path = ''
as $$
  select r.* from pgflow._start_runs(
    burst.flow_slug, array[burst.input],
    array['debounce:' || burst.debounce_key || ':'
      || to_char(burst.first_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')]
  ) as r;
$$;

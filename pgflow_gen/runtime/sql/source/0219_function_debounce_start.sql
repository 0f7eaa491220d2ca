-- Collapses a burst of starts into one run (engine 0030): starts of flow_slug with the same
-- debounce_key, each within period_s seconds of the one before, start one run, period_s after
-- the last of them, with the last one's input; with max_wait_s, no later than that after the
-- first, however long the burst goes on. Returns the pending start (its start_at, and how many
-- starts it holds). Exactly one run per burst across concurrent callers: the burst's row is the
-- lock. Workers' elected scheduler starts the run when it is due (start_debounced_runs); a start
-- that finds its burst due and not started yet starts that run itself, then opens a new burst.
-- Bounds: a key of 1 to 200 characters, period_s and max_wait_s above 0 and at most 30 days.
-- Clients call it, as start_flow; a session bound by a step role is held to its flow.
create function pgflow.debounce_start(
  flow_slug text, input jsonb, debounce_key text, period_s numeric, max_wait_s numeric default null
)
returns pgflow.debounced_starts
language sql
volatile
security definer
set search_path = ''
as $$
  select * from pgflow._debounce_start(
    flow_slug, input, debounce_key, period_s, max_wait_s, clock_timestamp()
  );
$$;

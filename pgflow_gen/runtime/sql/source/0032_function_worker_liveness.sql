-- The worker liveness rule, the one place in SQL that spells it: workers heartbeat every
-- heartbeat_interval; a worker counts as live (pgflow.worker_states) while its
-- heartbeat is younger than live_within, and its tasks count as stalled (requeue_stalled_tasks)
-- once it is older than stalled_after. Defaults 5 s, 15 s and 30 s (pgflow_gen.runtime.liveness
-- is the Python twin); an operator may set pgflow.heartbeat_interval, pgflow.live_within and
-- pgflow.stalled_after per database (every session must see one rule). Only an operator's
-- session may set its own (engine 0020, pgflow._engine_settings): a worker's session sees the
-- database's, so it cannot shorten the stall rule (it runs as the owner to read them). Workers read
-- it when they start. No writes.
create function pgflow.worker_liveness(
  out heartbeat_interval interval,
  out live_within interval,
  out stalled_after interval
)
language plpgsql
stable
parallel safe
security definer
set search_path = ''
as $$
declare
  v_set record := pgflow._engine_settings();
begin
  heartbeat_interval := coalesce(v_set.heartbeat_interval::interval, interval '5 seconds');
  live_within := coalesce(v_set.live_within::interval, interval '15 seconds');
  stalled_after := coalesce(v_set.stalled_after::interval, interval '30 seconds');
  -- GUARD: a live worker must never look stalled: at least two missed heartbeats before either;
  -- and a heartbeat at most ten times a second.
  if not (heartbeat_interval >= interval '0.1 seconds' and live_within >= 2 * heartbeat_interval
          and stalled_after >= live_within) then
    raise exception 'Inconsistent worker liveness settings: heartbeat every %, live within %, stalled after %.',
      heartbeat_interval, live_within, stalled_after
      using errcode = '22023',
        hint = 'Keep pgflow.heartbeat_interval >= 0.1 s, pgflow.live_within >= 2 x the heartbeat interval and pgflow.stalled_after >= pgflow.live_within.';
  end if;
end;
$$;

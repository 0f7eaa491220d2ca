-- Starts a schedule's runs for the given slots (engine 0017), each once whoever calls and however
-- often: a slot at or before the schedule's last_slot_at is passed over, and every run carries
-- the idempotency key "schedule:<name>:<slot in UTC>" (a race or a retry returns the run the key
-- started). Then moves last_slot_at to the latest of the slots and passed_through (the latest
-- slot the caller decided not to start: catch_up none or latest). A paused schedule starts
-- nothing and moves nothing. The scheduler in each worker computes the slots from the cron
-- expression; this function keeps the promise of once per slot, and bounds what a caller can
-- bend (engine 0020): a slot later than now is not started, at most the latest 100 slots of a
-- call start (the documented catch-up maximum), last_slot_at never moves past now, and a step
-- role starts only its own flow's schedules. Since engine 0021 it starts only slots the cron
-- expression names in the schedule's time zone (pgflow._cron_names); for syntax the engine does
-- not read (L, W, #, H) it falls back to whole minutes (whole seconds for a six-field
-- expression), so a caller starts at most one run per minute since the last slot. Returns each
-- slot it handled with its run and whether this call started it. The runs have the schedule's
-- priority (engine 0031). Locks the schedule's row.
create function pgflow.start_scheduled_runs(
  flow_slug text,
  schedule_name text,
  slots timestamptz[],
  passed_through timestamptz default null
)
returns table (slot timestamptz, run_id uuid, created boolean)
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_schedule pgflow.schedules;
  v_slot timestamptz;
  v_run pgflow.runs;
  v_now timestamptz := clock_timestamp();
  v_slots timestamptz[];
  v_unit text;
begin
  perform pgflow._require_flow_route(flow_slug);
  select * into v_schedule from pgflow.schedules as s
  where s.flow_slug = start_scheduled_runs.flow_slug and s.schedule_name = start_scheduled_runs.schedule_name
  for update;
  if not found then
    raise exception 'Flow "%" has no schedule "%".', flow_slug, schedule_name
      using errcode = 'P0002', hint = '`pgflow-gen schedules` lists them.';
  end if;
  if v_schedule.paused_at is not null then
    return;
  end if;
  -- The slots that may start: past ones the cron expression names (or, for syntax the engine
  -- does not read, any cron expression could name), after the last slot, the latest 100
  -- (MAX_CATCH_UP).
  v_unit := case when cardinality(regexp_split_to_array(btrim(v_schedule.cron), '\s+')) = 6
    then 'second' else 'minute' end;
  v_slots := array(
    select x.s from (
      select distinct s from unnest(slots) as s
      where s > coalesce(v_schedule.last_slot_at, '-infinity'::timestamptz) and s <= v_now
        and s = date_trunc(v_unit, s)
        and coalesce(pgflow._cron_names(v_schedule.cron, v_schedule.timezone, s), true)
      order by s desc
      limit 100
    ) as x
    order by x.s
  );
  foreach v_slot in array v_slots loop
    select * into v_run from pgflow.start_flow(
      start_scheduled_runs.flow_slug, v_schedule.input, null,
      format('schedule:%s:%s', start_scheduled_runs.schedule_name,
        to_char(v_slot at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')),
      v_schedule.priority);
    slot := v_slot;
    run_id := v_run.run_id;
    created := v_run.started_at = now();
    v_schedule.last_run_id := v_run.run_id;
    return next;
  end loop;
  update pgflow.schedules as s
  set last_slot_at = greatest(s.last_slot_at,
      (select max(x) from unnest(v_slots) as x),
      case when passed_through is not null then least(passed_through, v_now) end),
    last_run_id = v_schedule.last_run_id
  where s.flow_slug = start_scheduled_runs.flow_slug and s.schedule_name = start_scheduled_runs.schedule_name;
end;
$$;

-- The flows' schedules as the scheduler plans them (engine 0019: workers read no table): each
-- schedule's cron, time zone, catch-up policy, last slot started, when it was stored and whether it
-- is paused. No writes, no locks.
create function pgflow.list_schedules()
returns table (
  flow_slug text, name text, cron text, timezone text, catch_up text, last_slot_at timestamptz,
  created_at timestamptz, paused boolean
)
language sql
stable
security definer
set search_path = ''
as $$
  select s.flow_slug, s.schedule_name, s.cron, s.timezone, s.catch_up, s.last_slot_at, s.created_at,
    s.paused_at is not null
  from pgflow.schedules as s
$$;

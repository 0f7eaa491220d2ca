-- The flows' schedules as the scheduler plans them (engine 0019: workers read no table): each
-- schedule's cron, time zone, catch-up policy, last slot started, when it was stored and whether it
-- is paused. A step role (pgflow._session_step_roles; engine 0020) sees only its own flows'. No
-- writes, no locks.
create function pgflow.list_schedules()
returns table (
  flow_slug text, name text, cron text, timezone text, catch_up text, last_slot_at timestamptz,
  created_at timestamptz, paused boolean
)
language plpgsql
stable
security definer
set search_path = ''
as $$
declare
  v_step_role boolean := pgflow._session_is_step_role();
begin
  return query
    select s.flow_slug, s.schedule_name, s.cron, s.timezone, s.catch_up, s.last_slot_at, s.created_at,
      s.paused_at is not null
    from pgflow.schedules as s
    where not v_step_role
      or s.flow_slug in (select sr.flow_slug from pgflow._session_step_roles() as sr);
end;
$$;

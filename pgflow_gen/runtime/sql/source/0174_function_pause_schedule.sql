-- Pauses a schedule (engine 0017): it starts no run until resumed; pausing a paused one keeps
-- its paused_at. Returns the schedule.
create function pgflow.pause_schedule(flow_slug text, schedule_name text)
returns pgflow.schedules
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_schedule pgflow.schedules;
begin
  update pgflow.schedules as s set paused_at = coalesce(s.paused_at, now())
  where s.flow_slug = pause_schedule.flow_slug and s.schedule_name = pause_schedule.schedule_name
  returning s.* into v_schedule;
  if not found then
    raise exception 'Flow "%" has no schedule "%".', flow_slug, schedule_name
      using errcode = 'P0002', hint = '`pgflow-gen schedules` lists them.';
  end if;
  perform pgflow._record_action('pause_schedule', flow_slug, null, null,
    jsonb_build_object('schedule', schedule_name));
  return v_schedule;
end;
$$;

-- Resumes a paused schedule (engine 0017): the slots of the pause are passed over, whatever its
-- catch-up, so its next slot after now starts the next run. Returns the schedule.
create function pgflow.resume_schedule(flow_slug text, schedule_name text)
returns pgflow.schedules
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_schedule pgflow.schedules;
begin
  update pgflow.schedules as s
  set last_slot_at = case when s.paused_at is null then s.last_slot_at
      else greatest(s.last_slot_at, now()) end,
    paused_at = null
  where s.flow_slug = resume_schedule.flow_slug and s.schedule_name = resume_schedule.schedule_name
  returning s.* into v_schedule;
  if not found then
    raise exception 'Flow "%" has no schedule "%".', flow_slug, schedule_name
      using errcode = 'P0002', hint = '`pgflow-gen schedules` lists them.';
  end if;
  perform pgflow._record_action('resume_schedule', flow_slug, null, null,
    jsonb_build_object('schedule', schedule_name));
  return v_schedule;
end;
$$;

-- Sets a step's limits for pgflow.set_step_limits (set_by 'operator') and for a flow's spec
-- (pgflow._apply_flow_options, set_by 'spec'); all three null removes them. Checks the values
-- (whole numbers from 1; a rate limit with its period). When the step had no limits, the tasks it
-- has started already take their places (found through the flow's runs under way), so a cap set
-- while tasks run counts them. Returns the limits; null when removed.
create function pgflow._put_step_limits(
  flow_slug text,
  step_slug text,
  max_in_flight int,
  rate_limit int,
  rate_period_s int,
  set_by text
)
returns pgflow.step_limits
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_limits pgflow.step_limits;
begin
  if coalesce(max_in_flight, 1) < 1 or coalesce(rate_limit, 1) < 1 or coalesce(rate_period_s, 1) < 1 then
    raise exception 'Step limits must be whole numbers from 1 (max_in_flight %, rate_limit %, rate_period_s %).',
      coalesce(max_in_flight::text, 'null'), coalesce(rate_limit::text, 'null'), coalesce(rate_period_s::text, 'null')
      using errcode = '22023', hint = 'Pass null to clear a limit.';
  end if;
  if (rate_limit is null) <> (rate_period_s is null) then
    raise exception 'A rate limit needs both rate_limit (starts) and rate_period_s (seconds).'
      using errcode = '22023', hint = 'For example rate_limit => 100, rate_period_s => 60; both null clear it.';
  end if;
  if max_in_flight is null and rate_limit is null then
    delete from pgflow.step_limits as l
    where l.flow_slug = _put_step_limits.flow_slug and l.step_slug = _put_step_limits.step_slug;
    return null;
  end if;

  insert into pgflow.step_limits as l (flow_slug, step_slug, max_in_flight, rate_limit, rate_period_s, set_by)
  values (_put_step_limits.flow_slug, _put_step_limits.step_slug, _put_step_limits.max_in_flight,
    _put_step_limits.rate_limit, _put_step_limits.rate_period_s, _put_step_limits.set_by)
  on conflict on constraint step_limits_pkey do update
  set max_in_flight = excluded.max_in_flight, rate_limit = excluded.rate_limit,
    rate_period_s = excluded.rate_period_s, set_by = excluded.set_by, updated_at = now()
  returning * into v_limits;
  -- Untracked only when just created (a limited step's claims track every start).
  if not exists (
    select 1 from pgflow.step_slots as s
    where s.flow_slug = _put_step_limits.flow_slug and s.step_slug = _put_step_limits.step_slug
  ) then
    insert into pgflow.step_slots (flow_slug, step_slug, run_id, task_index, attempt, started_at)
    select t.flow_slug, t.step_slug, t.run_id, t.task_index, t.attempts_count, t.started_at
    from pgflow.runs as r
    join pgflow.step_tasks as t on t.run_id = r.run_id and t.step_slug = _put_step_limits.step_slug
    where r.status = 'started' and r.flow_slug = _put_step_limits.flow_slug and t.status = 'started'
    on conflict do nothing;
  end if;
  return v_limits;
end;
$$;

-- debounce_start's body with the clock as a parameter (engine 0030), so that tests can drive it;
-- only the engine's owner calls it. See pgflow.debounce_start.
create function pgflow._debounce_start(
  flow_slug text, input jsonb, debounce_key text, period_s numeric, max_wait_s numeric, now timestamptz
)
returns pgflow.debounced_starts
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_due pgflow.debounced_starts;
  v_pending pgflow.debounced_starts;
begin
  if not exists (select 1 from pgflow.flows as f where f.flow_slug = _debounce_start.flow_slug) then
    raise exception 'Flow "%" does not exist.', flow_slug
      using errcode = 'P0002', hint = 'Check the slug (it is case-sensitive) or compile the flow first.';
  end if;
  if input is null then
    raise exception 'A debounced start needs an input (JSON; {} for none).' using errcode = '22023';
  end if;
  if debounce_key is null or debounce_key = '' or length(debounce_key) > 200 then
    raise exception 'A debounce key is text of 1 to 200 characters.' using errcode = '22023';
  end if;
  if period_s is null or period_s <= 0 or period_s > 2592000 then
    raise exception 'period_s must be more than 0 and at most 2592000 (30 days), not %.', period_s
      using errcode = '22023';
  end if;
  if max_wait_s is not null and (max_wait_s <= 0 or max_wait_s > 2592000) then
    raise exception 'max_wait_s must be null or more than 0 and at most 2592000 (30 days), not %.',
      max_wait_s using errcode = '22023';
  end if;
  perform pgflow._require_flow_route(flow_slug);
  -- A burst whose run is due but not started yet (the scheduler has not come by) ended before
  -- this start: its run starts now, and this start opens a new burst.
  delete from pgflow.debounced_starts as d
  where d.flow_slug = _debounce_start.flow_slug and d.debounce_key = _debounce_start.debounce_key
    and d.start_at <= now
  returning * into v_due;
  if found then
    perform pgflow._start_debounced(v_due);
  end if;
  insert into pgflow.debounced_starts as d
    (flow_slug, debounce_key, input, first_at, last_at, start_at, deadline_at)
  values (
    flow_slug, debounce_key, input, now, now,
    least(now + make_interval(secs => period_s), now + make_interval(secs => max_wait_s)),
    now + make_interval(secs => max_wait_s)
  )
  on conflict on constraint debounced_starts_pkey do update
    set input = excluded.input, starts = d.starts + 1, last_at = excluded.last_at,
      start_at = least(excluded.last_at + make_interval(secs => period_s), d.deadline_at)
  returning * into v_pending;
  if v_pending.starts = 1 then
    -- A new burst: wake the workers' schedulers (their listeners hear it), idle ones too.
    perform pg_notify('pgflow_debounced', '{"event": "debounce:pending"}');
  end if;
  return v_pending;
end;
$$;

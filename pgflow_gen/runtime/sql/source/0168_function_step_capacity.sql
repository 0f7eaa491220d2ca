-- How many tasks of a step a claim may start now (engine 0017): null when the step has no limits;
-- else the room left under max_in_flight and under rate_limit in the last rate_period_s seconds,
-- and retry_in_s: when the first task beyond that room may start (the rate window's next free
-- start, or a short wait for a task in flight to finish). Locks the step's limits row until the claim commits,
-- so the claims of one limited step take turns and never start more than the limits allow
-- between them; deletes the slots that are neither in flight nor in the window. Called by
-- read_and_claim (before reading) and pgflow._claim_messages.
create function pgflow._step_capacity(
  flow_slug text,
  step_slug text,
  out allowed int,
  out retry_in_s float8
)
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_limit pgflow.step_limits;
  v_now timestamptz := clock_timestamp();
  v_window_start timestamptz;
  v_in_flight int;
  v_window int;
  v_frees_at timestamptz;
begin
  select * into v_limit from pgflow.step_limits as l
  where l.flow_slug = _step_capacity.flow_slug and l.step_slug = _step_capacity.step_slug
  for update;
  if not found then
    return;
  end if;
  v_window_start := v_now - make_interval(secs => coalesce(v_limit.rate_period_s, 0));

  delete from pgflow.step_slots as s
  where s.flow_slug = _step_capacity.flow_slug and s.step_slug = _step_capacity.step_slug
    and s.started_at <= v_window_start
    and not exists (
      select 1 from pgflow.step_tasks as t
      where t.run_id = s.run_id and t.step_slug = s.step_slug and t.task_index = s.task_index
        and t.status = 'started' and t.attempts_count = s.attempt
    );
  select
    count(*) filter (where exists (
      select 1 from pgflow.step_tasks as t
      where t.run_id = s.run_id and t.step_slug = s.step_slug and t.task_index = s.task_index
        and t.status = 'started' and t.attempts_count = s.attempt
    )),
    count(*) filter (where s.started_at > v_window_start)
  into v_in_flight, v_window
  from pgflow.step_slots as s
  where s.flow_slug = _step_capacity.flow_slug and s.step_slug = _step_capacity.step_slug;

  allowed := greatest(0, least(v_limit.max_in_flight - v_in_flight,
    case when v_limit.rate_limit is not null then v_limit.rate_limit - v_window end));
  -- When the first task beyond `allowed` may start: a task in flight frees its place when it
  -- finishes, which nothing announces, so soon; a rate window has room again when enough of its
  -- starts (counting the `allowed` ones starting now) leave it.
  if v_limit.max_in_flight is not null and v_in_flight + allowed >= v_limit.max_in_flight then
    retry_in_s := 0.25;
  end if;
  if v_limit.rate_limit is not null and v_window + allowed >= v_limit.rate_limit then
    select s.started_at + make_interval(secs => v_limit.rate_period_s) into v_frees_at
    from pgflow.step_slots as s
    where s.flow_slug = _step_capacity.flow_slug and s.step_slug = _step_capacity.step_slug
      and s.started_at > v_window_start
    order by s.started_at
    offset v_window + allowed - v_limit.rate_limit
    limit 1;
    retry_in_s := greatest(retry_in_s,
      extract(epoch from coalesce(v_frees_at, v_now + make_interval(secs => v_limit.rate_period_s)) - v_now)::float8);
  end if;
end;
$$;

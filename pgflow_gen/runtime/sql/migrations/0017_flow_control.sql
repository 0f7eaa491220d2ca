-- Engine migration 0017: flow control, enforced when tasks are claimed, across every worker.
--
-- pgflow.step_limits keeps a step's limits: max_in_flight (tasks started at once) and rate_limit
-- per rate_period_s (task starts in any window that long). pgflow.set_step_limits sets them live;
-- a flow's spec sets them too (step options maxInFlight, rateLimit, ratePeriod, applied with the
-- flow's other options). pgflow.step_slots keeps a limited step's starts, so a claim counts what
-- is in flight and what started in the window without reading the tasks table.
--
-- read_and_claim reads a limited step's own queue only as far as there is room, so messages
-- beyond a limit stay in the queue, in order, using no attempt; other claims (claim_tasks, and
-- flow-mode queues shared by several steps) hold back what they read beyond it. The claim's
-- internal pgflow._claim_messages takes the read's visibility, to hide what it read and did not
-- claim itself. pgflow.step_limit_usage reports each limited step's use. A flow without limits
-- claims as before, with one more index probe per claim.
--
-- pgflow.schedules keeps a flow's schedules (the shape's "schedules", stored with its other
-- options by _adopt_flow_description, whose hash includes them when there are some). The
-- workers compute the slots from the cron expression; pgflow.start_scheduled_runs starts one run
-- per slot (idempotency key "schedule:<name>:<slot>", and the schedule's last slot);
-- pgflow.pause_schedule and pgflow.resume_schedule stop and restart a schedule.

-- Flow control (engine 0017): a step's limits, enforced when tasks are claimed, across every
-- worker and every claim. max_in_flight caps the step's tasks started at once; rate_limit caps its
-- task starts in any rate_period_s seconds (each attempt of a task, and each element of a map,
-- is a start). A null limit is no limit; a step without a row has none. set_by says who set them:
-- the flow's spec (a generated migration applies them, and clears them again when the spec drops
-- them) or an operator (pgflow.set_step_limits; kept until an operator changes them, unless the
-- spec limits the step itself). Claims lock the row, so the claims of a limited step take turns.
create table pgflow.step_limits (
  flow_slug text not null,
  step_slug text not null,
  max_in_flight int,
  rate_limit int,
  rate_period_s int,
  set_by text not null default 'operator',
  updated_at timestamptz not null default now(),
  primary key (flow_slug, step_slug),
  foreign key (flow_slug, step_slug) references pgflow.steps (flow_slug, step_slug) on delete cascade,
  constraint step_limits_positive check (
    coalesce(max_in_flight, 1) > 0 and coalesce(rate_limit, 1) > 0 and coalesce(rate_period_s, 1) > 0
  ),
  constraint step_limits_rate_has_period check ((rate_limit is null) = (rate_period_s is null)),
  constraint step_limits_some_limit check (max_in_flight is not null or rate_limit is not null),
  constraint step_limits_set_by check (set_by in ('spec', 'operator'))
);

-- The starts of a limited step's tasks (one row per claimed attempt): the ones whose task is
-- still started with that attempt are in flight; the ones within the rate period are the window.
-- Claims of the step delete the rows that are neither, so the table holds about max_in_flight +
-- rate_limit rows per limited step. Gone with the step's limits.
create table pgflow.step_slots (
  flow_slug text not null,
  step_slug text not null,
  run_id uuid not null,
  task_index int not null,
  attempt int not null,
  started_at timestamptz not null,
  primary key (flow_slug, step_slug, run_id, task_index, attempt),
  foreign key (flow_slug, step_slug) references pgflow.step_limits (flow_slug, step_slug)
    on delete cascade
);

create index step_slots_started_at_idx on pgflow.step_slots (flow_slug, step_slug, started_at);

-- A flow's schedules (engine 0017), from its spec's `schedules`: a cron expression read in a
-- time zone, the run input, and what to do with slots missed while nothing ran them (catch_up:
-- none, latest or all). Workers start the runs (one elected per database; pgflow_gen.runtime's
-- scheduler computes the slots), each slot once: pgflow.start_scheduled_runs gives every run
-- the idempotency key "schedule:<name>:<slot>" and moves last_slot_at past it. A paused
-- schedule starts nothing; resuming it passes over the slots of the pause. Gone with the flow.
create table pgflow.schedules (
  flow_slug text not null references pgflow.flows (flow_slug) on delete cascade,
  schedule_name text not null,
  cron text not null,
  timezone text not null default 'UTC',
  input jsonb not null default '{}',
  catch_up text not null default 'none',
  paused_at timestamptz,
  -- The latest slot started or passed over (null: none yet; slots count from created_at).
  last_slot_at timestamptz,
  last_run_id uuid,
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now(),
  primary key (flow_slug, schedule_name),
  constraint schedules_catch_up check (catch_up in ('none', 'latest', 'all'))
);

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

-- Sets a step's limits, live, for every worker (engine 0017): at most max_in_flight of its tasks
-- started at once, and at most rate_limit task starts in any rate_period_s seconds (each attempt
-- and each map element counts). Null clears a limit; all null clears the step's limits. Messages
-- beyond a limit are not started, use no attempt, and are read again once there is room. A limit
-- set here stays until changed here, unless the flow's spec limits this step itself (applying its
-- migration sets the spec's). Returns the limits; null when cleared. A signal step runs no task and
-- takes no limit.
create function pgflow.set_step_limits(
  flow_slug text,
  step_slug text,
  max_in_flight int default null,
  rate_limit int default null,
  rate_period_s int default null
)
returns pgflow.step_limits
language plpgsql
volatile
set search_path = ''
as $$
begin
  perform pgflow._require_step(flow_slug, step_slug);
  if exists (
    select 1 from pgflow.steps as s
    where s.flow_slug = set_step_limits.flow_slug and s.step_slug = set_step_limits.step_slug
      and s.step_type = 'signal'
  ) then
    raise exception 'Step "%" of flow "%" is a signal step: it runs no task, so there is nothing to limit.',
      step_slug, flow_slug
      using errcode = '22023', hint = 'Limit the steps that depend on it instead.';
  end if;
  return pgflow._put_step_limits(flow_slug, step_slug, max_in_flight, rate_limit, rate_period_s, 'operator');
end;
$$;

-- Every limited step (of one flow, or of all) with its limits and their use now (engine 0017):
-- tasks in flight against max_in_flight, task starts in the last rate_period_s seconds against
-- rate_limit. Reads only the limited steps' slots; locks nothing. For status, coverage, the
-- dashboard and metrics.
create function pgflow.step_limit_usage(flow_slug text default null)
returns table (
  flow_slug text,
  step_slug text,
  queue_name text,
  max_in_flight int,
  rate_limit int,
  rate_period_s int,
  set_by text,
  in_flight bigint,
  window_starts bigint,
  updated_at timestamptz
)
language sql
stable
set search_path = ''
as $$
  select l.flow_slug, l.step_slug, s.queue_name, l.max_in_flight, l.rate_limit, l.rate_period_s,
    l.set_by,
    (select count(*) from pgflow.step_slots as x
     join pgflow.step_tasks as t on t.run_id = x.run_id and t.step_slug = x.step_slug
       and t.task_index = x.task_index
     where x.flow_slug = l.flow_slug and x.step_slug = l.step_slug
       and t.status = 'started' and t.attempts_count = x.attempt),
    (select count(*) from pgflow.step_slots as x
     where x.flow_slug = l.flow_slug and x.step_slug = l.step_slug and l.rate_period_s is not null
       and x.started_at > now() - make_interval(secs => l.rate_period_s)),
    l.updated_at
  from pgflow.step_limits as l
  join pgflow.steps as s on s.flow_slug = l.flow_slug and s.step_slug = l.step_slug
  where step_limit_usage.flow_slug is null or l.flow_slug = step_limit_usage.flow_slug
  order by l.flow_slug, s.step_index;
$$;

-- Keeps a flow's schedules in step with its shape's "schedules" ([{name, cron, timezone, input,
-- catchUp}], engine 0017): new ones are added (their slots count from now), changed ones take
-- the new cron, time zone, input and catch-up and keep their last slot and pause, and the ones
-- the shape no longer has are deleted. A shape without "options" (a hand-written one) changes
-- nothing. Checks each entry (a name, a cron, a known time zone, a catch-up policy). Returns
-- the changes, [{"schedule", "change": "added" | "changed" | "removed"}]. Called by
-- _adopt_flow_description under the flow's definition lock.
create function pgflow._store_schedules(flow_slug text, shape jsonb)
returns jsonb
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_wanted jsonb := coalesce(shape -> 'schedules', '[]');
  v_entry jsonb;
  v_changes jsonb := '[]';
  v_row record;
begin
  if shape -> 'options' is null then
    return v_changes;
  end if;
  if jsonb_typeof(v_wanted) <> 'array' then
    raise exception 'Invalid flow shape: "schedules" must be an array, got %.', jsonb_typeof(v_wanted)
      using errcode = '22023';
  end if;
  for v_entry in select e.value from jsonb_array_elements(v_wanted) as e loop
    if jsonb_typeof(v_entry -> 'name') is distinct from 'string' or jsonb_typeof(v_entry -> 'cron') is distinct from 'string' then
      raise exception 'Invalid flow shape: a schedule needs a "name" and a "cron" string, got %.', v_entry
        using errcode = '22023';
    end if;
    if not exists (select 1 from pg_catalog.pg_timezone_names as z where z.name = coalesce(v_entry ->> 'timezone', 'UTC')) then
      raise exception 'Invalid flow shape: schedule "%" has an unknown time zone "%".', v_entry ->> 'name', v_entry ->> 'timezone'
        using errcode = '22023', hint = 'Use an IANA name such as UTC or Europe/Paris.';
    end if;
    if coalesce(v_entry ->> 'catchUp', 'none') not in ('none', 'latest', 'all') then
      raise exception 'Invalid flow shape: schedule "%" has catchUp "%"; it takes none, latest or all.',
        v_entry ->> 'name', v_entry ->> 'catchUp'
        using errcode = '22023';
    end if;
  end loop;
  if (select count(distinct e.value ->> 'name') <> count(*) from jsonb_array_elements(v_wanted) as e) then
    raise exception 'Invalid flow shape: two schedules have the same name.' using errcode = '22023';
  end if;

  for v_row in
    select e.value as entry, s.schedule_name is null as is_new,
      s.cron is distinct from e.value ->> 'cron'
        or s.timezone is distinct from coalesce(e.value ->> 'timezone', 'UTC')
        or s.input is distinct from coalesce(e.value -> 'input', '{}')
        or s.catch_up is distinct from coalesce(e.value ->> 'catchUp', 'none') as is_changed
    from jsonb_array_elements(v_wanted) with ordinality as e (value, ord)
    left join pgflow.schedules as s
      on s.flow_slug = _store_schedules.flow_slug and s.schedule_name = e.value ->> 'name'
    order by e.ord
  loop
    continue when not (v_row.is_new or v_row.is_changed);
    insert into pgflow.schedules as s (flow_slug, schedule_name, cron, timezone, input, catch_up)
    values (_store_schedules.flow_slug, v_row.entry ->> 'name', v_row.entry ->> 'cron',
      coalesce(v_row.entry ->> 'timezone', 'UTC'), coalesce(v_row.entry -> 'input', '{}'),
      coalesce(v_row.entry ->> 'catchUp', 'none'))
    on conflict on constraint schedules_pkey do update
    set cron = excluded.cron, timezone = excluded.timezone, input = excluded.input,
      catch_up = excluded.catch_up, updated_at = now();
    v_changes := v_changes || jsonb_build_object('schedule', v_row.entry ->> 'name',
      'change', case when v_row.is_new then 'added' else 'changed' end);
  end loop;

  with gone as (
    delete from pgflow.schedules as s
    where s.flow_slug = _store_schedules.flow_slug
      and not exists (select 1 from jsonb_array_elements(v_wanted) as e where e.value ->> 'name' = s.schedule_name)
    returning s.schedule_name
  )
  select v_changes || coalesce(jsonb_agg(jsonb_build_object('schedule', g.schedule_name, 'change', 'removed')
      order by g.schedule_name), '[]')
  into v_changes from gone as g;
  return v_changes;
end;
$$;

-- Starts a schedule's runs for the given slots (engine 0017), each once whoever calls and however
-- often: a slot at or before the schedule's last_slot_at is passed over, and every run carries
-- the idempotency key "schedule:<name>:<slot in UTC>" (a race or a retry returns the run the key
-- started). Then moves last_slot_at to the latest of the slots and passed_through (the latest
-- slot the caller decided not to start: catch_up none or latest). A paused schedule starts
-- nothing and moves nothing. The scheduler in each worker computes the slots from the cron
-- expression; this function only keeps the promise of once per slot. Returns each slot it
-- handled with its run and whether this call started it. Locks the schedule's row.
create function pgflow.start_scheduled_runs(
  flow_slug text,
  schedule_name text,
  slots timestamptz[],
  passed_through timestamptz default null
)
returns table (slot timestamptz, run_id uuid, created boolean)
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_schedule pgflow.schedules;
  v_slot timestamptz;
  v_run pgflow.runs;
begin
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
  for v_slot in
    select distinct s from unnest(slots) as s
    where s > coalesce(v_schedule.last_slot_at, '-infinity'::timestamptz)
    order by s
  loop
    select * into v_run from pgflow.start_flow(
      start_scheduled_runs.flow_slug, v_schedule.input, null,
      format('schedule:%s:%s', start_scheduled_runs.schedule_name,
        to_char(v_slot at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')));
    slot := v_slot;
    run_id := v_run.run_id;
    created := v_run.started_at = now();
    v_schedule.last_run_id := v_run.run_id;
    return next;
  end loop;
  update pgflow.schedules as s
  set last_slot_at = greatest(s.last_slot_at, (select max(x) from unnest(slots) as x), passed_through),
    last_run_id = v_schedule.last_run_id
  where s.flow_slug = start_scheduled_runs.flow_slug and s.schedule_name = start_scheduled_runs.schedule_name;
end;
$$;

-- Pauses a schedule (engine 0017): it starts no run until resumed; pausing a paused one keeps
-- its paused_at. Returns the schedule.
create function pgflow.pause_schedule(flow_slug text, schedule_name text)
returns pgflow.schedules
language plpgsql
volatile
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
  return v_schedule;
end;
$$;

-- Resumes a paused schedule (engine 0017): the slots of the pause are passed over, whatever its
-- catch-up, so its next slot after now starts the next run. Returns the schedule.
create function pgflow.resume_schedule(flow_slug text, schedule_name text)
returns pgflow.schedules
language plpgsql
volatile
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
  return v_schedule;
end;
$$;

drop function pgflow._claim_messages(text, text, uuid, text, bigint[], text[], int[], int);

-- The claim itself (engine 0014), for messages read from the queue of a route pgflow._claim_route
-- checked: starts the queued tasks of this flow (and step) among them whose run and step are
-- started, and returns them with their inputs, the attempt each claim started (the fencing token
-- of the task's callbacks) and the step's effective timeout. Each message's lease is the step's
-- timeout + 2 s: `lease` says which one the read already set (read_and_claim reads with it), and
-- only the others are set here.
-- Task rows locked by someone else are skipped (their message comes back later), so a claim never
-- waits; then PGMQ rows are locked. Messages of this flow (and step) whose task no longer exists
-- are archived (a warning names them); other foreign ones are left alone.
-- A worker marked stopped, or silent for longer than the liveness rule's live_within, that claims
-- is registered again (a claim proves it alive).
-- Tasks of a paused step (pgflow.step_pauses) are not claimed: their messages are held out of
-- sight for 60 s at a time and listed in pgflow.held_messages (resume_step shows them again at
-- once), and a notice names them (JSON detail: held_message_ids), so a worker does not take them
-- for foreign messages.
-- Tasks of a step with limits (pgflow.step_limits, engine 0017) are started only as far as
-- pgflow._step_capacity allows, in message order; the others are held back, using no attempt,
-- until there is room again (the rate window's next free start, or 1 s), and a notice names them
-- (JSON detail: limited_message_ids). Each started one takes a slot (pgflow.step_slots).
-- Messages read with the claim's lease (read_and_claim passes it, with its own read_vt) that it
-- does not claim are hidden for read_vt seconds instead, as pgmq.read would; held ones keep
-- their hold.
-- Its plans are generic (planning its statements for every claim cost more than running them)
-- and index-driven: a generic plan made while the tables were small would otherwise join the
-- claimed rows by scanning every task, a cost that grows with the table.
create function pgflow._claim_messages(
  flow_slug text,
  queue_name text,
  worker_id uuid,
  step_slug text,
  msg_ids bigint[],
  step_slugs text[],
  timeouts int[],
  lease int,
  read_vt int
)
returns setof pgflow.claimed_task
language plpgsql
volatile
set search_path = ''
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
as $$
declare
  v_run_ids uuid[];
  v_step_slugs text[];
  v_task_indexes int[];
  v_message_ids bigint[];
  v_attempts int[];
  v_timeouts int[];
  v_unleased bigint[];
  v_offsets int[];
  v_visible_set int;
  v_orphans bigint[];
  v_stopped_at timestamptz;
  v_heartbeat_at timestamptz;
  v_paused boolean;
  v_held bigint[];
  v_limited_steps text[];
  v_limited bigint[];
  v_limited_holds int[];
  v_capacity record;
  v_step text;
  v_over bigint[];
  v_rehidden bigint[];
  v_source record;
  v_array jsonb;
  v_elements jsonb[];
begin
  select w.stopped_at, w.last_heartbeat_at into v_stopped_at, v_heartbeat_at
  from pgflow.workers as w where w.worker_id = _claim_messages.worker_id;
  if not found then
    raise exception 'Worker % is not registered.', worker_id
      using errcode = 'P0002', hint = 'Register it with pgflow.register_worker() before claiming.';
  end if;
  -- GUARD: a claim proves its worker alive. One marked stopped, or silent for longer than the live
  -- window, is registered again, or stall recovery would take what it claims the moment it does.
  if v_stopped_at is not null
     or v_heartbeat_at < clock_timestamp() - (pgflow.worker_liveness()).live_within then
    update pgflow.workers as w set stopped_at = null, last_heartbeat_at = clock_timestamp()
    where w.worker_id = _claim_messages.worker_id;
  end if;

  -- GUARD: a paused step starts no task; what was read of it is held, using no attempt.
  v_paused := exists (select 1 from pgflow.step_pauses as p where p.flow_slug = _claim_messages.flow_slug);
  if v_paused then
    with held as (
      select t.message_id, t.step_slug
      from pgflow.step_tasks as t
      join pgflow.step_pauses as p on p.flow_slug = t.flow_slug and p.step_slug = t.step_slug
      where t.queue_name = _claim_messages.queue_name and t.message_id = any (_claim_messages.msg_ids)
        and t.flow_slug = _claim_messages.flow_slug and t.status = 'queued'
      order by t.run_id, t.step_slug, t.task_index
      -- The pause is held too, so a resume cannot delete it before its messages are listed.
      for update of t skip locked for key share of p
    ),
    listed as (
      insert into pgflow.held_messages (queue_name, message_id, flow_slug, step_slug)
      select _claim_messages.queue_name, h.message_id, _claim_messages.flow_slug, h.step_slug from held as h
      on conflict do nothing
    )
    select array_agg(h.message_id order by h.message_id) into v_held from held as h;
    if v_held is not null then
      perform pgflow.set_vt_batch(queue_name, v_held, array_fill(60, array[cardinality(v_held)]));
      raise notice 'claim_tasks held % message(s) of paused steps in queue "%".',
        cardinality(v_held), queue_name
        using detail = jsonb_build_object('held_message_ids', to_jsonb(v_held))::text;
    end if;
  end if;

  -- GUARD: a limited step starts no more tasks than its limits allow; the rest are held back, in
  -- message order, using no attempt. Limits rows are locked in step order (claims take turns).
  if exists (select 1 from pgflow.step_limits as l where l.flow_slug = _claim_messages.flow_slug) then
    for v_step in
      select l.step_slug from pgflow.step_limits as l
      where l.flow_slug = _claim_messages.flow_slug
        and (_claim_messages.step_slug is null or l.step_slug = _claim_messages.step_slug)
        and not exists (
          select 1 from pgflow.step_pauses as p
          where p.flow_slug = l.flow_slug and p.step_slug = l.step_slug
        )
        and exists (
          select 1 from pgflow.step_tasks as t
          where t.message_id = any (_claim_messages.msg_ids) and t.queue_name = _claim_messages.queue_name
            and t.flow_slug = l.flow_slug and t.step_slug = l.step_slug and t.status = 'queued'
        )
      order by l.step_slug
    loop
      select * into v_capacity from pgflow._step_capacity(flow_slug, v_step);
      continue when v_capacity.allowed is null;  -- its limits were cleared meanwhile
      v_limited_steps := v_limited_steps || v_step;
      v_over := array(
        select t.message_id from pgflow.step_tasks as t
        where t.message_id = any (_claim_messages.msg_ids) and t.queue_name = _claim_messages.queue_name
          and t.flow_slug = _claim_messages.flow_slug and t.step_slug = v_step and t.status = 'queued'
        order by t.message_id
        offset v_capacity.allowed);
      v_limited := coalesce(v_limited, '{}') || v_over;
      v_limited_holds := coalesce(v_limited_holds, '{}')
        || array_fill(greatest(1, ceil(coalesce(v_capacity.retry_in_s, 1)))::int, array[cardinality(v_over)]);
    end loop;
    if cardinality(v_limited) > 0 then
      perform pgflow.set_vt_batch(queue_name, v_limited, v_limited_holds);
      raise notice 'claim_tasks limited % message(s) of queue "%": their steps are at a limit.',
        cardinality(v_limited), queue_name
        using detail = jsonb_build_object('limited_message_ids', to_jsonb(v_limited))::text;
    end if;
  end if;

  -- GUARD: only queued tasks are claimed (a queued task always belongs to a started run and step:
  -- failing a run cancels its tasks, skipping a step skips them); the task row lock decides races.
  with candidates as (
    select t.run_id, t.step_slug, t.task_index
    from pgflow.step_tasks as t
    where t.message_id = any (_claim_messages.msg_ids) and t.queue_name = _claim_messages.queue_name
      and t.flow_slug = _claim_messages.flow_slug and t.status = 'queued'
      and (_claim_messages.step_slug is null or t.step_slug = _claim_messages.step_slug)
      and not (v_paused and exists (
        select 1 from pgflow.step_pauses as p
        where p.flow_slug = t.flow_slug and p.step_slug = t.step_slug
      ))
      and not (t.message_id = any (coalesce(v_limited, '{}')))
    order by t.run_id, t.step_slug, t.task_index
    for update skip locked
  ),
  claimed as (
    update pgflow.step_tasks as t
    set status = 'started', attempts_count = t.attempts_count + 1,
      started_at = clock_timestamp(), last_worker_id = _claim_messages.worker_id,
      -- A step added since the route was read (add_step on a flow-mode flow) is looked up.
      claimed_timeout = coalesce(
        _claim_messages.timeouts[array_position(_claim_messages.step_slugs, t.step_slug)],
        (select coalesce(s.opt_timeout, f.opt_timeout)
         from pgflow.steps as s join pgflow.flows as f on f.flow_slug = s.flow_slug
         where s.flow_slug = t.flow_slug and s.step_slug = t.step_slug)),
      lease_renewed_at = null
    from candidates as c
    where t.run_id = c.run_id and t.step_slug = c.step_slug and t.task_index = c.task_index
    returning t.run_id, t.step_slug, t.task_index, t.message_id, t.attempts_count, t.claimed_timeout
  )
  select array_agg(c.run_id), array_agg(c.step_slug), array_agg(c.task_index),
    array_agg(c.message_id), array_agg(c.attempts_count), array_agg(c.claimed_timeout)
  into v_run_ids, v_step_slugs, v_task_indexes, v_message_ids, v_attempts, v_timeouts
  from claimed as c;
  -- Messages of this flow (and step) whose task no longer exists (a run deleted or pruned
  -- before 0008 left them) would come back after every lease: archive them and say so. Only
  -- when some message read was not claimed (the common claim takes them all and skips this).
  if cardinality(msg_ids) > coalesce(cardinality(v_message_ids), 0) then
    execute format($sql$
      select array_agg(q.msg_id order by q.msg_id) from pgmq.%I as q
      where q.msg_id = any ($1) and not (q.msg_id = any ($2))
        and q.message ->> 'flow_slug' = $3 and ($4::text is null or q.message ->> 'step_slug' = $4)
        and q.message ->> 'run_id' ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
        and q.message ->> 'task_index' ~ '^[0-9]{1,9}$'
        and not exists (
          select 1 from pgflow.step_tasks as t
          where t.run_id = (case when q.message ->> 'run_id' ~* '^[0-9a-f-]{36}$' then (q.message ->> 'run_id')::uuid end)
            and t.step_slug = q.message ->> 'step_slug'
            and t.task_index = (case when q.message ->> 'task_index' ~ '^[0-9]{1,9}$' then (q.message ->> 'task_index')::int end)
        )
      $sql$, pgflow.pgmq_table_name(queue_name))
    into v_orphans using msg_ids, coalesce(v_message_ids, '{}'), flow_slug, step_slug;
  end if;
  if v_orphans is not null then
    perform pgmq.archive(queue_name, v_orphans);
    raise warning 'claim_tasks archived % message(s) of queue "%" whose task no longer exists.',
      cardinality(v_orphans), queue_name
      using detail = jsonb_build_object('archived_message_ids', to_jsonb(v_orphans))::text;
  end if;
  -- Read with the claim's lease, what it did not claim is hidden for the read's visibility instead;
  -- what it held (a paused step's, a limited step's) keeps its hold, what it archived is gone.
  if lease is not null and lease <> read_vt
     and cardinality(msg_ids) > coalesce(cardinality(v_message_ids), 0) then
    v_rehidden := array(
      select m.id from unnest(msg_ids) as m (id)
      except
      select u.id from unnest(coalesce(v_message_ids, '{}') || coalesce(v_held, '{}')
        || coalesce(v_limited, '{}') || coalesce(v_orphans, '{}')) as u (id)
      order by 1);
    perform pgflow.set_vt_batch(queue_name, v_rehidden, array_fill(read_vt, array[cardinality(v_rehidden)]));
  end if;
  if v_message_ids is null then
    return;
  end if;
  if v_limited_steps is not null then
    insert into pgflow.step_slots (flow_slug, step_slug, run_id, task_index, attempt, started_at)
    select _claim_messages.flow_slug, c.step_slug, c.run_id, c.task_index, c.attempt, clock_timestamp()
    from unnest(v_run_ids, v_step_slugs, v_task_indexes, v_attempts) as c (run_id, step_slug, task_index, attempt)
    where c.step_slug = any (v_limited_steps);
  end if;

  -- GUARD: the lease must be in place before any task is returned, or the claim is undone. The
  -- read set it already where it read with the step's own (the common case: nothing to do).
  select array_agg(x.m order by x.n), array_agg(x.t + 2 order by x.n) into v_unleased, v_offsets
  from unnest(v_message_ids, v_timeouts) with ordinality as x (m, t, n)
  where lease is null or x.t + 2 <> lease;
  if v_unleased is not null then
    select count(*) into v_visible_set from pgflow.set_vt_batch(queue_name, v_unleased, v_offsets);
    if v_visible_set <> cardinality(v_unleased) then
      raise exception 'claim_tasks: % of % claimed messages are missing from queue "%".',
        cardinality(v_unleased) - v_visible_set, cardinality(v_unleased), queue_name
        using hint = 'Messages of pgflow queues must only be archived or deleted by pgflow.';
    end if;
  end if;

  -- GUARD: a map task's input is one element of an array (the run input, or its dependency's
  -- output) that may be large: it is read and unpacked once per run and step of the claim, not
  -- once per task (a value read from its table is unpacked again by every use).
  for v_source in
    select distinct c.run_id, c.step_slug, s.deps_count
    from unnest(v_run_ids, v_step_slugs) as c (run_id, step_slug)
    join pgflow.steps as s on s.flow_slug = _claim_messages.flow_slug and s.step_slug = c.step_slug
    where s.step_type = 'map'
  loop
    if v_source.deps_count = 0 then
      select r.input || '[]'::jsonb into v_array from pgflow.runs as r where r.run_id = v_source.run_id;
    else
      select dep.output || '[]'::jsonb into v_array
      from pgflow.deps as d
      join pgflow.step_states as dep on dep.run_id = v_source.run_id and dep.step_slug = d.dep_slug
      where d.flow_slug = _claim_messages.flow_slug and d.step_slug = v_source.step_slug;
    end if;
    v_elements := array(
      select case when c.run_id = v_source.run_id and c.step_slug = v_source.step_slug
        then v_array -> c.task_index else v_elements[c.n] end
      from unnest(v_run_ids, v_step_slugs, v_task_indexes) with ordinality as c (run_id, step_slug, task_index, n)
      order by c.n);
  end loop;

  return query
  select _claim_messages.flow_slug, c.run_id, c.step_slug,
    case
      when s.step_type = 'map' then v_elements[c.n]
      else coalesce((
        select jsonb_object_agg(d.dep_slug, dep.output)
        from pgflow.deps as d
        join pgflow.step_states as dep on dep.run_id = c.run_id and dep.step_slug = d.dep_slug
        where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug and dep.status = 'completed'
      ), '{}'::jsonb)
    end,
    c.message_id, c.task_index,
    case when s.step_type = 'single' and s.deps_count = 0 then r.input end,
    c.attempt, c.timeout
  from unnest(v_run_ids, v_step_slugs, v_task_indexes, v_message_ids, v_attempts, v_timeouts)
    with ordinality as c (run_id, step_slug, task_index, message_id, attempt, timeout, n)
  join pgflow.runs as r on r.run_id = c.run_id
  join pgflow.steps as s on s.flow_slug = _claim_messages.flow_slug and s.step_slug = c.step_slug
  order by c.message_id;
end;
$$;

-- The claim, phase two of reading a task: of the messages a worker read from queue_name, claims the
-- queued tasks of this flow whose run and step are started, extends each message's visibility to
-- the step's timeout + 2 s, and returns the tasks with their inputs, the attempt each claim
-- started (the fencing token of the task's callbacks) and the step's effective timeout.
-- The selector follows the flow's queue mode (pgflow._claim_route): a step-queued flow claims only
-- tasks of step_slug, which must name a step exactly and queue_name its exact route; a flow-mode
-- flow takes no step. A wrong selector raises before anything changes. The claim itself, its
-- locks, held messages of paused steps, limited steps (engine 0017) and archived orphans are
-- pgflow._claim_messages's.
create or replace function pgflow.claim_tasks(
  flow_slug text,
  msg_ids bigint[],
  worker_id uuid,
  queue_name text,
  step_slug text default null
)
returns setof pgflow.claimed_task
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_route record;
begin
  v_route := pgflow._claim_route(flow_slug, queue_name, step_slug);
  if msg_ids is null or cardinality(msg_ids) = 0 then
    return;
  end if;
  return query select * from pgflow._claim_messages(flow_slug, v_route.queue, worker_id, step_slug,
    msg_ids, v_route.step_slugs, v_route.timeouts, null, null);
end;
$$;

-- The claim in one call (engine 0012): reads up to qty messages of queue_name and claims their
-- tasks (pgflow._claim_messages), in one statement, so a worker polls with one round trip and one
-- commit instead of two. The selector follows claim_tasks's rules and is checked before anything
-- is read. Since engine 0014 it reads with the lease its claims set (the steps' timeout + 2 s,
-- when they agree), so a claimed message is touched once; a message it read and did not claim
-- (foreign, or another claim's) is hidden for vt seconds, as pgmq.read would (held ones keep
-- their hold), and named in a notice (JSON detail: unclaimed_message_ids), after the claim's own notices. When it
-- read fewer than qty, another notice says when the queue's next hidden message shows again
-- (JSON detail: next_visible_in_s), so that the worker wakes then.
-- A step-queued flow's step with limits (engine 0017) is read only as far as there is room under
-- them (pgflow._step_capacity), so messages beyond a limit stay in the queue, untouched and in
-- order: a notice says so (JSON detail: limited_step, wanted, allowed), and the next-visible
-- notice then says when to ask again.
-- Locks as claim_tasks does (task rows before PGMQ rows; pgmq.read skips locked messages), and
-- holds the read's message locks until it commits (completions archive their own messages, so
-- none waits for them unless its lease ran out and this read took the message).
create or replace function pgflow.read_and_claim(
  flow_slug text,
  queue_name text,
  worker_id uuid,
  qty int,
  vt int,
  step_slug text default null
)
returns setof pgflow.claimed_task
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_route record;
  v_read bigint[];
  v_claimed pgflow.claimed_task[];
  v_unclaimed bigint[];
  v_next float8;
  v_qty int := qty;
  v_allowed int;
  v_retry float8;
begin
  -- GUARD: a wrong selector raises before any message is read (no messages: nothing claimed).
  v_route := pgflow._claim_route(flow_slug, queue_name, step_slug);
  if step_slug is not null and exists (
    select 1 from pgflow.step_limits as l
    where l.flow_slug = read_and_claim.flow_slug and l.step_slug = read_and_claim.step_slug
  ) then
    select c.allowed, c.retry_in_s into v_allowed, v_retry
    from pgflow._step_capacity(flow_slug, step_slug) as c;
    if v_allowed >= qty then
      v_retry := null;  -- room for all it asks for
    else
      v_qty := v_allowed;
      raise notice 'read_and_claim limited step "%" of flow "%" to % of % task(s).',
        step_slug, flow_slug, v_qty, qty
        using detail = jsonb_build_object('limited_step', step_slug, 'wanted', qty, 'allowed', v_qty)::text;
    end if;
  end if;
  v_read := '{}';
  if v_qty > 0 then
    select coalesce(array_agg(m.msg_id), '{}') into v_read
    from pgmq.read(v_route.queue, coalesce(v_route.lease, vt), v_qty) as m;
  end if;
  -- A worker that read less than it asked for sleeps until a message comes: an insert wakes it,
  -- but nothing tells it when a hidden one (a retry's delay, a start delay, a lease) shows again.
  -- So say when the first of them does, and it sleeps until then rather than a whole poll.
  if cardinality(v_read) < qty then
    execute format(
      'select extract(epoch from min(q.vt) - clock_timestamp())::float8 from pgmq.%I as q'
      ' where q.vt > clock_timestamp() and not (q.msg_id = any ($1))',
      pgflow.pgmq_table_name(v_route.queue))
    into v_next using v_read;
    if v_retry is not null then
      v_next := least(v_next, v_retry);  -- no room now: ask again then
    end if;
    if v_next is not null then
      raise notice 'read_and_claim: the next message of queue "%" is visible in % s.',
        v_route.queue, round(v_next::numeric, 3)
        using detail = jsonb_build_object('next_visible_in_s', v_next)::text;
    end if;
  end if;
  if cardinality(v_read) = 0 then
    return;
  end if;
  select coalesce(array_agg(c order by c.msg_id), '{}') into v_claimed
  from pgflow._claim_messages(flow_slug, v_route.queue, worker_id, step_slug, v_read,
    v_route.step_slugs, v_route.timeouts, v_route.lease, vt) as c;
  if cardinality(v_claimed) < cardinality(v_read) then
    v_unclaimed := array(
      select r.id from unnest(v_read) as r (id)
      except
      select c.msg_id from unnest(v_claimed) as c
      order by 1
    );
    raise notice 'read_and_claim left % message(s) of queue "%" unclaimed.',
      cardinality(v_unclaimed), v_route.queue
      using detail = jsonb_build_object('unclaimed_message_ids', to_jsonb(v_unclaimed))::text;
  end if;
  return query select * from unnest(v_claimed);
end;
$$;

-- Keeps a flow's options (retries, delays, timeouts) in step with the shape it was verified
-- against: options are not part of the compared shape, so an edited spec changes them in place,
-- with no recompile. A shape without top-level "options" (a hand-written one) changes no option,
-- the steps' neither; otherwise a step without an option inherits the flow's. Returns the changes, [{"step": null | slug, "option",
-- "from", "to"}] (null: the flow's default), and notifies them on the channel pgflow_flows. Tasks
-- claimed before keep the timeout of their claim. Since engine 0017 a step's options may hold its
-- limits (maxInFlight, rateLimit, ratePeriod; pgflow.step_limits): a step that has some gets
-- exactly those (set by the spec), a step without loses the ones a spec set before, and keeps
-- the ones an operator set. Called by _adopt_flow_description under the flow's definition lock.
create or replace function pgflow._apply_flow_options(flow_slug text, shape jsonb)
returns jsonb
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_flow jsonb := shape -> 'options';
  v_changes jsonb;
begin
  if v_flow is null or jsonb_typeof(v_flow) <> 'object' then
    return '[]'::jsonb;
  end if;

  with wanted as (
    -- The flow's options (an option the shape leaves out stays as it is), then every step's.
    select null::text as step_slug, -1 as step_index, o.option, o.ord, o.current, coalesce(o.wanted, o.current) as wanted
    from pgflow.flows as f,
      unnest(
        array['maxAttempts', 'baseDelay', 'timeout'],
        array[f.opt_max_attempts, f.opt_base_delay, f.opt_timeout],
        array[(v_flow ->> 'maxAttempts')::int, (v_flow ->> 'baseDelay')::int, (v_flow ->> 'timeout')::int]
      ) with ordinality as o (option, current, wanted, ord)
    where f.flow_slug = _apply_flow_options.flow_slug
    union all
    select s.step_slug, s.step_index, o.option, o.ord, o.current, o.wanted
    from jsonb_array_elements(shape -> 'steps') as e (step)
    join pgflow.steps as s on s.flow_slug = _apply_flow_options.flow_slug and s.step_slug = e.step ->> 'slug',
      unnest(
        array['maxAttempts', 'baseDelay', 'timeout', 'startDelay'],
        array[s.opt_max_attempts, s.opt_base_delay, s.opt_timeout, s.opt_start_delay],
        array[(e.step #>> '{options,maxAttempts}')::int, (e.step #>> '{options,baseDelay}')::int,
              (e.step #>> '{options,timeout}')::int, (e.step #>> '{options,startDelay}')::int]
      ) with ordinality as o (option, current, wanted, ord)
  ),
  limited as (
    -- Limits: the spec's where it sets some, none where it sets none over a spec's, else as they are.
    select s.step_slug, s.step_index, o.option, 4 + o.ord as ord, o.current,
      case
        when e.step -> 'options' ?| array['maxInFlight', 'rateLimit', 'ratePeriod'] then o.declared
        when l.set_by = 'spec' then null
        else o.current
      end as wanted
    from jsonb_array_elements(shape -> 'steps') as e (step)
    join pgflow.steps as s on s.flow_slug = _apply_flow_options.flow_slug and s.step_slug = e.step ->> 'slug'
    left join pgflow.step_limits as l on l.flow_slug = s.flow_slug and l.step_slug = s.step_slug,
      unnest(
        array['maxInFlight', 'rateLimit', 'ratePeriod'],
        array[l.max_in_flight, l.rate_limit, l.rate_period_s],
        array[(e.step #>> '{options,maxInFlight}')::int, (e.step #>> '{options,rateLimit}')::int,
              (e.step #>> '{options,ratePeriod}')::int]
      ) with ordinality as o (option, current, declared, ord)
  )
  select jsonb_agg(jsonb_build_object('step', w.step_slug, 'option', w.option, 'from', w.current, 'to', w.wanted)
      order by w.step_index, w.ord)
  into v_changes
  from (select * from wanted union all select * from limited) as w
  where w.current is distinct from w.wanted;

  -- A spec that limits a step owns its limits, even when they are the ones an operator set.
  update pgflow.step_limits as l set set_by = 'spec'
  from jsonb_array_elements(shape -> 'steps') as e (step)
  where l.flow_slug = _apply_flow_options.flow_slug and l.step_slug = e.step ->> 'slug'
    and e.step -> 'options' ?| array['maxInFlight', 'rateLimit', 'ratePeriod'] and l.set_by <> 'spec';
  if v_changes is null then
    return '[]'::jsonb;
  end if;

  update pgflow.flows as f
  set opt_max_attempts = coalesce((v_flow ->> 'maxAttempts')::int, f.opt_max_attempts),
    opt_base_delay = coalesce((v_flow ->> 'baseDelay')::int, f.opt_base_delay),
    opt_timeout = coalesce((v_flow ->> 'timeout')::int, f.opt_timeout)
  where f.flow_slug = _apply_flow_options.flow_slug;
  update pgflow.steps as s
  set opt_max_attempts = (e.step #>> '{options,maxAttempts}')::int,
    opt_base_delay = (e.step #>> '{options,baseDelay}')::int,
    opt_timeout = (e.step #>> '{options,timeout}')::int,
    opt_start_delay = (e.step #>> '{options,startDelay}')::int
  from jsonb_array_elements(shape -> 'steps') as e (step)
  where s.flow_slug = _apply_flow_options.flow_slug and s.step_slug = e.step ->> 'slug';
  perform pgflow._put_step_limits(flow_slug, c.step,
    case when e.step -> 'options' ?| array['maxInFlight', 'rateLimit', 'ratePeriod'] then (e.step #>> '{options,maxInFlight}')::int end,
    case when e.step -> 'options' ?| array['maxInFlight', 'rateLimit', 'ratePeriod'] then (e.step #>> '{options,rateLimit}')::int end,
    case when e.step -> 'options' ?| array['maxInFlight', 'rateLimit', 'ratePeriod'] then (e.step #>> '{options,ratePeriod}')::int end,
    'spec')
  from (select distinct x ->> 'step' as slug from jsonb_array_elements(v_changes) as x
        where x ->> 'option' in ('maxInFlight', 'rateLimit', 'ratePeriod')) as c (step)
  join jsonb_array_elements(shape -> 'steps') as e (step) on e.step ->> 'slug' = c.step;

  perform pg_notify('pgflow_flows', jsonb_build_object(
    'event', 'flow:options_updated', 'flow_slug', flow_slug, 'changes', v_changes
  )::text);
  return v_changes;
end;
$$;

-- Adopts a shape's description (its "inputSchema", its options, its signal steps'
-- "payloadSchema" and, since engine 0017, its "schedules"; see pgflow.flow_descriptions) for a
-- flow, or keeps the stored one when the shape's is older. The rule: a description the
-- database has never seen is newer and is adopted, and so is the current one again; one it has
-- seen but is not the current one is older, and is kept out, unless the caller adopts it
-- explicitly (a generated migration sets pgflow.adopt_description = on for its transaction) or
-- the database is local (pgflow.local = on: every worker's description is adopted, as in dev).
-- Returns {"kept": false, "optionsUpdated": [...], "schedulesUpdated": [...]} or {"kept": true,
-- "adoptedAt": <the stored description's>}. Called by ensure_flow_compiled under the flow's
-- definition lock.
create or replace function pgflow._adopt_flow_description(flow_slug text, shape jsonb)
returns jsonb
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_hash text := md5((jsonb_build_object(
    'inputSchema', shape -> 'inputSchema',
    'options', shape -> 'options',
    'steps', (
      select coalesce(jsonb_agg(jsonb_build_object('slug', e.step ->> 'slug', 'options', e.step -> 'options')
          -- Since engine 0011 a signal step's payload schema too (only when there is one, so
          -- that the descriptions of flows without signals hash as before).
          || case when e.step ? 'payloadSchema'
            then jsonb_build_object('payloadSchema', e.step -> 'payloadSchema') else '{}' end
        order by e.ord), '[]'::jsonb)
      from jsonb_array_elements(shape -> 'steps') with ordinality as e (step, ord)
    )
  -- Since engine 0017 its schedules too (only when it has some, so that the descriptions of
  -- flows without schedules hash as before).
  ) || case when shape ? 'schedules' then jsonb_build_object('schedules', shape -> 'schedules') else '{}' end
  )::text);
  v_current text;
  v_adopted_at timestamptz;
begin
  select d.description_hash, d.adopted_at into v_current, v_adopted_at
  from pgflow.flow_descriptions as d
  where d.flow_slug = _adopt_flow_description.flow_slug
  order by d.adopted_at desc, d.description_hash
  limit 1;
  if v_current is distinct from v_hash
    and exists (
      select 1 from pgflow.flow_descriptions as d
      where d.flow_slug = _adopt_flow_description.flow_slug and d.description_hash = v_hash
    )
    and coalesce(current_setting('pgflow.adopt_description', true), '') <> 'on'
    and coalesce(current_setting('pgflow.local', true), '') <> 'on'
  then
    return jsonb_build_object('kept', true, 'adoptedAt', v_adopted_at);
  end if;

  if v_current is distinct from v_hash then
    -- clock_timestamp: two adoptions in one transaction (a migration file with two versions of a
    -- flow) keep their order.
    insert into pgflow.flow_descriptions as d (flow_slug, description_hash, first_seen_at, adopted_at)
    values (_adopt_flow_description.flow_slug, v_hash, clock_timestamp(), clock_timestamp())
    on conflict on constraint flow_descriptions_pkey do update set adopted_at = excluded.adopted_at;
  end if;
  perform pgflow._store_input_schema(flow_slug, shape);
  perform pgflow._store_payload_schemas(flow_slug, shape);
  return jsonb_build_object('kept', false, 'optionsUpdated', pgflow._apply_flow_options(flow_slug, shape),
    'schedulesUpdated', pgflow._store_schedules(flow_slug, shape));
end;
$$;

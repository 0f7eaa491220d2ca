-- Engine migration 0021: schedules start only the slots their cron expression names, and a claim
-- no longer looks up the worker liveness settings.
--
-- start_scheduled_runs (engine 0020 bounded it by the clock, whole minutes and the catch-up
-- maximum) now also checks each slot against the schedule's cron expression in its time zone,
-- read as the scheduler's croniter reads the standard syntax (pgflow._cron_names,
-- pgflow._cron_values); for syntax the engine does not read (L, W, #, H) the bounds of 0020 hold.
-- A claim re-registers a silent worker by the session's own live window instead of calling
-- pgflow.worker_liveness (which read pg_db_role_setting: about 8 % of a batch-1 claim), and
-- pgflow._engine_settings returns the defaults at once when no liveness setting is defined for
-- the session (nor so by the database).

-- BEGIN HAND-WRITTEN: tables and data, applied before the functions below.
-- END HAND-WRITTEN

-- Written by `make migration` from pgflow_gen/runtime/sql/source/: edit the source, then
-- write the migration again; only the header and the hand-written section above are kept.

-- pgflow._claim_messages: source/0154_function_claim_messages.sql
create or replace function pgflow._claim_messages(
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
  v_registered_by text;
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
  select w.stopped_at, w.last_heartbeat_at, w.registered_by into v_stopped_at, v_heartbeat_at, v_registered_by
  from pgflow.workers as w where w.worker_id = _claim_messages.worker_id;
  if not found then
    raise exception 'Worker % is not registered.', worker_id
      using errcode = 'P0002', hint = 'Register it with pgflow.register_worker() before claiming.';
  end if;
  if v_registered_by is distinct from session_user then
    perform pgflow._require_worker_owner(worker_id, v_registered_by);
  end if;
  -- GUARD: a claim proves its worker alive. One marked stopped, or silent for longer than the live
  -- window, is registered again, or stall recovery would take what it claims the moment it does.
  -- The window is the session's own (engine 0021: no settings lookup per claim): a caller that
  -- bends it changes only when its own worker id is registered again.
  if v_stopped_at is not null
     or v_heartbeat_at < clock_timestamp()
       - coalesce(nullif(current_setting('pgflow.live_within', true), '')::interval, interval '15 seconds') then
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
      perform pgflow._set_vt_batch(queue_name, v_held, array_fill(60, array[cardinality(v_held)]));
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
      perform pgflow._set_vt_batch(queue_name, v_limited, v_limited_holds);
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
    perform pgflow._set_vt_batch(queue_name, v_rehidden, array_fill(read_vt, array[cardinality(v_rehidden)]));
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
    select count(*) into v_visible_set from pgflow._set_vt_batch(queue_name, v_unleased, v_offsets);
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

-- pgflow.start_scheduled_runs: source/0173_function_start_scheduled_runs.sql
create or replace function pgflow.start_scheduled_runs(
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
        to_char(v_slot at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')));
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

-- pgflow._engine_settings: source/0198_function_engine_settings.sql
create or replace function pgflow._engine_settings(
  out heartbeat_interval text,
  out live_within text,
  out stalled_after text
)
language plpgsql
stable
set search_path = ''
as $$
declare
  v_item text;
  v_database text[] := array[null, null, null];
begin
  -- Set nowhere (the usual case; engine 0021): the defaults, without reading the catalog. A
  -- setting the database (or the role) sets, or the session ever set, is defined (not null) for
  -- the whole session, so a null one is one the database does not set either.
  if current_setting('pgflow.heartbeat_interval', true) is null
      and current_setting('pgflow.live_within', true) is null
      and current_setting('pgflow.stalled_after', true) is null then
    return;
  end if;
  heartbeat_interval := nullif(current_setting('pgflow.heartbeat_interval', true), '');
  live_within := nullif(current_setting('pgflow.live_within', true), '');
  stalled_after := nullif(current_setting('pgflow.stalled_after', true), '');
  foreach v_item in array coalesce((
    select s.setconfig from pg_catalog.pg_db_role_setting as s
    where s.setrole = 0
      and s.setdatabase = (select d.oid from pg_catalog.pg_database as d where d.datname = current_database())
  ), '{}') loop
    case split_part(v_item, '=', 1)
      when 'pgflow.heartbeat_interval' then v_database[1] := nullif(substr(v_item, strpos(v_item, '=') + 1), '');
      when 'pgflow.live_within' then v_database[2] := nullif(substr(v_item, strpos(v_item, '=') + 1), '');
      when 'pgflow.stalled_after' then v_database[3] := nullif(substr(v_item, strpos(v_item, '=') + 1), '');
      else null;
    end case;
  end loop;
  if array[heartbeat_interval, live_within, stalled_after] is not distinct from v_database
    or pgflow._session_is_operator() then
    return;
  end if;
  heartbeat_interval := v_database[1];
  live_within := v_database[2];
  stalled_after := v_database[3];
end;
$$;

-- pgflow._cron_values: source/0203_function_cron_values.sql
create function pgflow._cron_values(field text, field_index int)
returns int[]
language plpgsql
immutable
set search_path = ''
as $$
declare
  v_low int := (array[0, 0, 0, 1, 1, 0])[field_index + 1];
  v_high int := (array[59, 59, 23, 31, 12, 6])[field_index + 1];
  v_names text[] := case field_index
    when 4 then array['jan', 'feb', 'mar', 'apr', 'may', 'jun', 'jul', 'aug', 'sep', 'oct', 'nov', 'dec']
    when 5 then array['sun', 'mon', 'tue', 'wed', 'thu', 'fri', 'sat']
  end;
  v_item text;
  v_parts text[];
  v_from int;
  v_to int;
  v_step int;
  v_values int[] := '{}';
begin
  if field = '*' or field = '?' and field_index in (3, 5) then
    return array(select generate_series(v_low, v_high));
  end if;
  foreach v_item in array string_to_array(field, ',') loop
    v_parts := regexp_match(v_item, '^(\*|[a-z]{3}|[0-9]{1,2})(?:-([a-z]{3}|[0-9]{1,2}))?(?:/([0-9]{1,2}))?$');
    if v_parts is null or v_parts[1] = '*' and (v_parts[2] is not null or v_parts[3] is null) then
      return null;
    end if;
    v_step := coalesce(v_parts[3]::int, 1);
    if v_parts[1] = '*' then
      v_from := v_low;
      v_to := v_high;
    else
      v_from := case when v_parts[1] ~ '^[0-9]' then v_parts[1]::int
        else array_position(v_names, v_parts[1]) - 1 + v_low end;
      v_to := case
        when v_parts[2] ~ '^[0-9]' then v_parts[2]::int
        when v_parts[2] is not null then array_position(v_names, v_parts[2]) - 1 + v_low
        when v_parts[3] is not null then v_high
        else v_from
      end;
      if v_from is null or v_to is null then
        return null;  -- a name the field does not have
      end if;
      if field_index = 5 and v_from = 7 and v_parts[2] is null and v_parts[3] is null then
        v_from := 0;
        v_to := 0;
      end if;
      if v_from < v_low or v_to > v_high or (v_parts[2] is not null or v_parts[3] is not null) and v_from >= v_to then
        return null;
      end if;
    end if;
    if v_step < 1 then
      return null;
    end if;
    v_values := v_values || array(select generate_series(v_from, v_to, v_step));
  end loop;
  return v_values;
end;
$$;

-- pgflow._cron_names: source/0204_function_cron_names.sql
create function pgflow._cron_names(cron text, timezone text, slot timestamptz)
returns boolean
language plpgsql
stable
set search_path = ''
as $$
declare
  v_fields text[] := regexp_split_to_array(lower(btrim(cron)), '\s+');
  v_seconds int[];
  v_minutes int[];
  v_hours int[];
  v_days int[];
  v_months int[];
  v_weekdays int[];
  v_any_day boolean;
  v_any_weekday boolean;
  v_day boolean;
  v_weekday boolean;
  v_local timestamp := slot at time zone timezone;
  -- How much further than an hour the local clock went in the hour before the slot.
  v_skipped interval := v_local - ((slot - interval '1 hour') at time zone timezone) - interval '1 hour';
  v_at timestamp;
begin
  if cardinality(v_fields) = 5 then
    v_fields := array['0'] || v_fields;
  elsif cardinality(v_fields) = 6 then
    v_fields := array[v_fields[6]] || v_fields[1:5];
  else
    return null;
  end if;
  v_seconds := pgflow._cron_values(v_fields[1], 0);
  v_minutes := pgflow._cron_values(v_fields[2], 1);
  v_hours := pgflow._cron_values(v_fields[3], 2);
  v_days := pgflow._cron_values(v_fields[4], 3);
  v_months := pgflow._cron_values(v_fields[5], 4);
  v_weekdays := pgflow._cron_values(v_fields[6], 5);
  if v_seconds is null or v_minutes is null or v_hours is null or v_days is null
      or v_months is null or v_weekdays is null then
    return null;
  end if;
  v_any_day := v_fields[4] in ('*', '?')
    or strpos(v_fields[6], '*') > 0 and v_days @> array(select generate_series(1, 31));
  v_any_weekday := v_fields[6] in ('*', '?')
    or strpos(v_fields[4], '*') > 0 and v_weekdays @> array(select generate_series(0, 6));
  -- The slot itself, then each whole second the clock skipped up to v_skipped before it.
  v_at := v_local;
  loop
    v_day := extract(day from v_at)::int = any (v_days);
    v_weekday := extract(dow from v_at)::int = any (v_weekdays);
    if date_trunc('second', v_at) = v_at
        and (v_at = v_local or (v_at at time zone timezone) at time zone timezone <> v_at)
        and extract(second from v_at)::int = any (v_seconds)
        and extract(minute from v_at)::int = any (v_minutes)
        and extract(hour from v_at)::int = any (v_hours)
        and extract(month from v_at)::int = any (v_months)
        and ((v_any_day or v_any_weekday) and (v_any_day or v_day) and (v_any_weekday or v_weekday)
          or not (v_any_day or v_any_weekday) and (v_day or v_weekday)) then
      return true;
    end if;
    if v_at = v_local then
      if v_skipped <= interval '0' then
        return false;
      end if;
      v_at := date_trunc('second', v_local - v_skipped);
    else
      v_at := v_at + interval '1 second';
    end if;
    if v_at >= v_local then
      return false;
    end if;
  end loop;
end;
$$;
-- No engine function runs for PUBLIC (engine 0019), those above included.
revoke execute on all functions in schema pgflow from public;

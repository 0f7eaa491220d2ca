-- The claim itself (engine 0014), for messages read from the queue of a route pgflow._claim_route
-- checked: starts the queued tasks of this flow (and step) among them whose run and step are
-- started, and returns them with their inputs, the attempt each claim started (the fencing token
-- of the task's callbacks) and the step's effective timeout. Each message's lease is the step's
-- timeout + 2 s: `lease` says which one the read already set (read_and_claim reads with it), and
-- only the others are set here.
-- Task rows locked by someone else are skipped (their message comes back later), so a claim never
-- waits; then PGMQ rows are locked. Messages of this flow (and step) whose task no longer exists
-- are archived (a warning names them); other foreign ones are left alone.
-- A worker marked stopped, or silent for longer than the liveness rule's live_within (as the
-- session sees it, engine 0021), that claims is registered again (a claim proves it alive). Only the login role that registered the worker
-- id claims as it (engine 0020, pgflow._require_worker_owner).
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

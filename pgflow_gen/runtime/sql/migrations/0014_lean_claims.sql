-- Engine migration 0014: fewer statements per task, and a completion and the next claim in one
-- call.
--
-- read_and_claim reads with the lease its claim sets (the steps' timeout + 2 s, when they agree),
-- so a claimed message is updated once instead of twice. claim_tasks and read_and_claim share one
-- route check (pgflow._claim_route) and one claim (pgflow._claim_messages), whose plans are
-- generic and index-driven: planning its statements for every claim cost more than running them.
-- complete_task archives its task's message itself, instead of recording it in
-- pgflow.archivable_messages for the next claim to archive; this migration archives what is
-- recorded there.
--
-- pgflow.complete_and_claim(flow_slug, queue_name, worker_id, qty, vt, step_slug, run_ids,
-- step_slugs, task_indexes, outputs, attempts) completes a worker's results and claims its next
-- tasks in one transaction. pgflow.start_flows(flow_slug, inputs, idempotency_keys) starts many
-- runs of one flow in one call, set-based.
--
-- Every function keeps its signature and behaviour, so workers of earlier releases run on it
-- unchanged.

-- The route a claim takes its tasks from, checked once per claim (engine 0014): the flow's queue
-- mode decides the selector (a step-queued flow claims one step, named exactly, from that step's
-- own queue; a flow-mode flow takes no step). Returns the queue, the steps whose tasks the claim
-- may start with their effective timeouts, and the lease each claimed message gets when those
-- timeouts agree (timeout + 2 s; null when they differ). Raises on a wrong selector; no writes.
-- Called by claim_tasks and read_and_claim.
create function pgflow._claim_route(
  flow_slug text,
  queue_name text,
  step_slug text,
  out queue text,
  out step_slugs text[],
  out timeouts int[],
  out lease int
)
language plpgsql
stable
set search_path = ''
as $$
declare
  v_mode text;
  v_flow_timeout int;
  v_route text;
  v_twin text;
begin
  if queue_name is null then
    raise exception 'A claim needs the queue the messages were read from.' using errcode = '22004';
  end if;
  select f.queue_mode, f.opt_timeout into v_mode, v_flow_timeout
  from pgflow.flows as f where f.flow_slug = _claim_route.flow_slug;
  if not found then
    raise exception 'Flow "%" does not exist.', flow_slug using errcode = 'P0002';
  end if;
  queue := lower(queue_name);
  if v_mode = 'flow' and step_slug is not null then
    raise exception 'Flow "%" uses its default queue, so claiming takes no step slug.', flow_slug
      using errcode = '22023', hint = 'Claim without step_slug for a flow-mode flow.';
  end if;
  if v_mode = 'step' then
    if step_slug is null then
      raise exception 'Flow "%" uses per-step queues, so claiming needs the step slug.', flow_slug
        using errcode = '22023', hint = 'Pass step_slug => the step this worker runs, with that step''s queue.';
    end if;
    select s.queue_name into v_route from pgflow.steps as s
    where s.flow_slug = _claim_route.flow_slug and s.step_slug = _claim_route.step_slug;
    if not found then
      select s.step_slug into v_twin from pgflow.steps as s
      where s.flow_slug = _claim_route.flow_slug and lower(s.step_slug) = lower(_claim_route.step_slug);
      if v_twin is not null then
        raise exception 'Flow "%" has no step "%".', flow_slug, step_slug
          using errcode = '22023', detail = format('Step slugs match exactly; did you mean "%s"?', v_twin);
      end if;
      raise exception 'Flow "%" has no step "%".', flow_slug, step_slug using errcode = '22023';
    end if;
    if v_route <> queue_name then
      raise exception 'Step "%" of flow "%" is routed to queue "%", not "%".', step_slug, flow_slug, v_route, queue_name
        using errcode = '22023', hint = 'Claim with the messages read from the step''s own queue.';
    end if;
    queue := v_route;
  end if;
  select array_agg(s.step_slug order by s.step_index),
    array_agg(coalesce(s.opt_timeout, v_flow_timeout) order by s.step_index),
    case when min(coalesce(s.opt_timeout, v_flow_timeout)) = max(coalesce(s.opt_timeout, v_flow_timeout))
      then max(coalesce(s.opt_timeout, v_flow_timeout)) + 2 end
  into step_slugs, timeouts, lease
  from pgflow.steps as s
  where s.flow_slug = _claim_route.flow_slug and s.step_type <> 'signal'
    and (_claim_route.step_slug is null or s.step_slug = _claim_route.step_slug);
end;
$$;

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
  lease int
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
  if v_message_ids is null then
    return;
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
-- locks, held messages of paused steps and archived orphans are pgflow._claim_messages's.
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
    msg_ids, v_route.step_slugs, v_route.timeouts, null);
end;
$$;

-- The claim in one call (engine 0012): reads up to qty messages of queue_name and claims their
-- tasks (pgflow._claim_messages), in one statement, so a worker polls with one round trip and one
-- commit instead of two. The selector follows claim_tasks's rules and is checked before anything
-- is read. Since engine 0014 it reads with the lease its claims set (the steps' timeout + 2 s,
-- when they agree), so a claimed message is touched once; a message it read and did not claim
-- (held, archived, foreign, or another claim's) is hidden for vt seconds, as pgmq.read would, and
-- named in a notice (JSON detail: unclaimed_message_ids), after the claim's own notices. When it
-- read fewer than qty, another notice says when the queue's next hidden message shows again
-- (JSON detail: next_visible_in_s), so that the worker wakes then.
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
  v_rehidden bigint[];
  v_next float8;
begin
  -- GUARD: a wrong selector raises before any message is read (no messages: nothing claimed).
  v_route := pgflow._claim_route(flow_slug, queue_name, step_slug);
  select coalesce(array_agg(m.msg_id), '{}') into v_read
  from pgmq.read(v_route.queue, coalesce(v_route.lease, vt), qty) as m;
  -- A worker that read less than it asked for sleeps until a message comes: an insert wakes it,
  -- but nothing tells it when a hidden one (a retry's delay, a start delay, a lease) shows again.
  -- So say when the first of them does, and it sleeps until then rather than a whole poll.
  if cardinality(v_read) < qty then
    execute format(
      'select extract(epoch from min(q.vt) - clock_timestamp())::float8 from pgmq.%I as q'
      ' where q.vt > clock_timestamp() and not (q.msg_id = any ($1))',
      pgflow.pgmq_table_name(v_route.queue))
    into v_next using v_read;
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
    v_route.step_slugs, v_route.timeouts, v_route.lease) as c;
  if cardinality(v_claimed) < cardinality(v_read) then
    v_unclaimed := array(
      select r.id from unnest(v_read) as r (id)
      except
      select c.msg_id from unnest(v_claimed) as c
      order by 1
    );
    -- Read with a claim's lease, they are hidden for the read's visibility instead; held
    -- messages of paused steps keep the minute the claim gave them.
    if v_route.lease is not null and v_route.lease <> vt then
      v_rehidden := array(
        select u.id from unnest(v_unclaimed) as u (id)
        where not exists (
          select 1 from pgflow.held_messages as h
          where h.queue_name = v_route.queue and h.message_id = u.id)
        order by 1);
      perform pgflow.set_vt_batch(v_route.queue, v_rehidden,
        array_fill(vt, array[cardinality(v_rehidden)]));
    end if;
    raise notice 'read_and_claim left % message(s) of queue "%" unclaimed.',
      cardinality(v_unclaimed), v_route.queue
      using detail = jsonb_build_object('unclaimed_message_ids', to_jsonb(v_unclaimed))::text;
  end if;
  return query select * from unnest(v_claimed);
end;
$$;

-- A busy worker's round trip (engine 0014): completes the tasks it has results for, as
-- complete_tasks does, then reads and claims up to qty tasks, as read_and_claim does, in one
-- transaction: one call and one commit for both. Tasks the completion started can be claimed at
-- once (their messages are visible to the read). Returns the claimed tasks; results the engine
-- ignored (a stale attempt, a task cancelled meanwhile) are named in a notice (JSON detail:
-- ignored_results, each with the result's position from 1, the task's current attempt and its
-- status), so the worker can say so as it does for complete_tasks's rows. A refused result
-- (complete_tasks raises) changes nothing and claims nothing. Locks as complete_tasks, then as
-- read_and_claim.
create function pgflow.complete_and_claim(
  flow_slug text,
  queue_name text,
  worker_id uuid,
  qty int,
  vt int,
  step_slug text,
  run_ids uuid[],
  step_slugs text[],
  task_indexes int[],
  outputs jsonb[],
  attempts int[]
)
returns setof pgflow.claimed_task
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_ignored jsonb;
begin
  select jsonb_agg(jsonb_build_array(t.ordinality, t.attempts_count, t.status) order by t.ordinality) into v_ignored
  from pgflow.complete_tasks(run_ids, step_slugs, task_indexes, outputs, attempts)
    with ordinality as t
  where t.status <> 'completed' or t.attempts_count <> attempts[t.ordinality];
  if v_ignored is not null then
    raise notice 'complete_and_claim ignored % result(s).', jsonb_array_length(v_ignored)
      using detail = jsonb_build_object('ignored_results', v_ignored)::text;
  end if;
  if qty > 0 then
    return query select * from pgflow.read_and_claim(flow_slug, queue_name, worker_id, qty, vt, step_slug);
  end if;
end;
$$;

-- A worker reports a task's output. The last task of a step completes the step (a map's output
-- is its task outputs in task order), which readies children and may complete the run.
-- Late callbacks (run finished, step closed, task not started) change nothing, and so does a
-- stale one: `attempt` (from claim_tasks) is not the task's current attempt. Either returns the
-- task's row unchanged; a stale one's attempts_count differs from `attempt`.
-- Locks run, step state and task (in that order, in one statement), then the task's message,
-- which it archives (since engine 0014; before, the next claim archived it, which cost more).
create or replace function pgflow.complete_task(run_id uuid, step_slug text, task_index int, output jsonb, attempt int)
returns setof pgflow.step_tasks
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_locked record;
  v_task pgflow.step_tasks;
  v_output_type text := coalesce(jsonb_typeof(output), 'SQL NULL');
begin
  select r.status as run_status, ss.status as step_status, ss.remaining_tasks, s.step_type, t as task,
    -- The first map step fed by this single step, if any (its output must then be an array).
    (select c.step_slug from pgflow.deps as d
     join pgflow.steps as c on c.flow_slug = d.flow_slug and c.step_slug = d.step_slug
     where s.step_type = 'single' and d.flow_slug = s.flow_slug and d.dep_slug = s.step_slug
       and c.step_type = 'map'
     order by c.step_index limit 1) as map_child
  into v_locked
  from pgflow.runs as r
  join pgflow.step_states as ss on ss.run_id = r.run_id and ss.step_slug = complete_task.step_slug
  join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
  join pgflow.step_tasks as t
    on t.run_id = r.run_id and t.step_slug = ss.step_slug and t.task_index = complete_task.task_index
  where r.run_id = complete_task.run_id
  for update of r, ss, t;
  if not found then
    if not exists (select 1 from pgflow.runs as r where r.run_id = complete_task.run_id) then
      raise exception 'Run % does not exist.', run_id using errcode = 'P0002';
    end if;
    raise exception 'Task % of step "%" in run % does not exist.', task_index, step_slug, run_id
      using errcode = 'P0002';
  end if;
  v_task := v_locked.task;

  -- GUARD: a callback of an earlier attempt is stale and changes nothing: since that attempt,
  -- the task failed and was retried, or stall recovery requeued it, and another claim started
  -- the attempt that is current now. A null attempt answers whichever attempt is current.
  if attempt is not null and v_task.attempts_count <> attempt then
    return next v_task;
    return;
  end if;

  -- GUARD: late callbacks are no-ops.
  if v_locked.run_status <> 'started' or v_locked.step_status <> 'started' or v_task.status <> 'started' then
    return next v_task;
    return;
  end if;

  -- GUARD: a single step that feeds a map must produce an array; anything else fails the run.
  if v_locked.map_child is not null and v_output_type <> 'array' then
    update pgflow.step_tasks as t
    set status = 'failed', output = complete_task.output, failed_at = clock_timestamp(),
      error_message = format('[TYPE_VIOLATION] Produced %s instead of array', v_output_type)
    where t.run_id = complete_task.run_id and t.step_slug = complete_task.step_slug
      and t.task_index = complete_task.task_index
    returning * into v_task;
    update pgflow.step_states as ss
    set status = 'failed', failed_at = clock_timestamp(), remaining_tasks = null,
      error_message = format('[TYPE_VIOLATION] Map step %s expects array input but dependency %s produced %s',
        v_locked.map_child, complete_task.step_slug, v_output_type)
    where ss.run_id = complete_task.run_id and ss.step_slug = complete_task.step_slug;
    perform pgflow._emit_event(run_id, 'step:failed', step_slug, 'failed');
    perform pgflow._fail_run(run_id);
    perform pgmq.archive(v_task.queue_name, v_task.message_id);
    return next v_task;
    return;
  end if;

  update pgflow.step_tasks as t
  set status = 'completed', output = complete_task.output, completed_at = clock_timestamp()
  where t.run_id = complete_task.run_id and t.step_slug = complete_task.step_slug
    and t.task_index = complete_task.task_index
  returning * into v_task;

  if v_locked.remaining_tasks > 1 then
    update pgflow.step_states as ss set remaining_tasks = ss.remaining_tasks - 1
    where ss.run_id = complete_task.run_id and ss.step_slug = complete_task.step_slug;
  elsif pgflow._complete_step(run_id, step_slug,
      case when v_locked.step_type = 'map' then (
        select jsonb_agg(t.output order by t.task_index)
        from pgflow.step_tasks as t
        where t.run_id = complete_task.run_id and t.step_slug = complete_task.step_slug
      ) else output end) then
    perform pgflow._advance_run(run_id);
  end if;

  perform pgmq.archive(v_task.queue_name, v_task.message_id);
  return next v_task;
end;
$$;

-- Completes a batch of tasks in one call, as complete_task would one after another (a worker
-- reports the results it collected together). Returns each task's row afterwards, in input order.
--
-- The common case is done set-based, a handful of statements for the whole batch: a started task
-- of a single step whose children are all plain single steps (no condition, not a map). Its step
-- completes, every child whose last dependency finished starts (one message insert per queue for
-- the batch), the tasks' messages are archived (one call per queue), and runs with no step left
-- complete. So are the tasks of a map step that has more tasks left than the batch holds of it
-- (engine 0014): they only count their step down. Every other task (a map task that may finish
-- its step, a step with a conditional or map child, a late callback of a finished run) goes
-- through complete_task, after the set-based ones, in input order; so does a batch that names a
-- task twice, and a batch of one (complete_task is cheaper for a single task). `attempts` fences
-- each result as complete_task's `attempt` does: a stale one changes nothing and its row comes
-- back unchanged.
--
-- A task that does not exist raises complete_task's error and changes nothing. Locks every run,
-- step state and task of the batch first, in key order, so concurrent batches cannot deadlock.
-- The rows locked are updated by their row ids (ctid; stable while we hold the lock), and the
-- planner settings keep every plan index-driven and its joins in the written order: these tables
-- grow from empty faster than autovacuum analyses them, and a sequential scan per batch would
-- grow with them.
create or replace function pgflow.complete_tasks(
  run_ids uuid[], step_slugs text[], task_indexes int[], outputs jsonb[], attempts int[]
)
returns setof pgflow.step_tasks
language plpgsql
volatile
set search_path = ''
set enable_seqscan = off
set plan_cache_mode = force_generic_plan
set join_collapse_limit = 1
as $$
declare
  v_count int := coalesce(cardinality(run_ids), 0);
  v_batch record;
  v_started record;
  v_missing record;
  v_queue text;
  v_finished uuid[];
  v_general int[];
  v_attempts int[];
  v_map_positions bigint[];
  v_map_task_rows tid[];
  v_map_state_rows tid[];
  v_map_queues text[];
  v_map_messages bigint[];
  i int;
begin
  if coalesce(cardinality(step_slugs), 0) <> v_count or coalesce(cardinality(task_indexes), 0) <> v_count
    or coalesce(cardinality(outputs), 0) <> v_count
    or (attempts is not null and coalesce(cardinality(attempts), 0) <> v_count) then
    raise exception 'complete_tasks needs arrays of one length (got % run ids, % step slugs, % task indexes, % outputs, % attempts).',
      v_count, coalesce(cardinality(step_slugs), 0), coalesce(cardinality(task_indexes), 0),
      coalesce(cardinality(outputs), 0), coalesce(cardinality(attempts), v_count)
      using errcode = '22023';
  end if;
  if v_count = 0 then
    return;
  end if;
  -- Elements are paired by position, and the general path indexes them from 1.
  if array_ndims(run_ids) <> 1 or array_lower(run_ids, 1) <> 1
    or array_ndims(step_slugs) <> 1 or array_lower(step_slugs, 1) <> 1
    or array_ndims(task_indexes) <> 1 or array_lower(task_indexes, 1) <> 1
    or array_ndims(outputs) <> 1 or array_lower(outputs, 1) <> 1
    or (attempts is not null and (array_ndims(attempts) <> 1 or array_lower(attempts, 1) <> 1)) then
    raise exception 'complete_tasks needs one-dimensional arrays that start at index 1.'
      using errcode = '22023';
  end if;
  -- A null attempts array answers whichever attempts are current, as null elements do.
  v_attempts := coalesce(attempts, array_fill(null::int, array[v_count]));
  if v_count = 1 then
    return query select * from pgflow.complete_task(run_ids[1], step_slugs[1], task_indexes[1], outputs[1],
      v_attempts[1]);
    return;
  end if;

  with locked as (
    select u.ord, u.output, r.run_id, ss.flow_slug, ss.step_slug, t.task_index,
      t.ctid as task_row, ss.ctid as state_row,
      r.status = 'started' and ss.status = 'started' and t.status = 'started'
        and (u.attempt is null or u.attempt = t.attempts_count) as live,
      s.step_type = 'map' as mapped, ss.remaining_tasks,
      s.step_type = 'single' and not exists (
        select 1 from pgflow.deps as d
        join pgflow.steps as c on c.flow_slug = d.flow_slug and c.step_slug = d.step_slug
        where d.flow_slug = s.flow_slug and d.dep_slug = s.step_slug
          and (c.step_type <> 'single' or c.required_input_pattern is not null
            or c.forbidden_input_pattern is not null)
      ) as plain
    -- Joined in this order (join_collapse_limit), each by its whole key: a task by the key
    -- the caller sends, never by its step alone (a big map step has thousands).
    from unnest(run_ids, step_slugs, task_indexes, outputs, v_attempts) with ordinality
      as u (run_id, step_slug, task_index, output, attempt, ord)
    join pgflow.step_tasks as t
      on t.run_id = u.run_id and t.step_slug = u.step_slug and t.task_index = u.task_index
    join pgflow.step_states as ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug
    join pgflow.runs as r on r.run_id = t.run_id
    join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    order by r.run_id, ss.step_slug, t.task_index
    for update of r, ss, t
  )
  select count(*) as found,
    count(distinct (l.run_id, l.step_slug, l.task_index)) as distinct_found,
    array_agg(l.ord order by l.ord) filter (where l.live and l.plain) as positions,
    array_agg(l.run_id order by l.ord) filter (where l.live and l.plain) as run_ids,
    array_agg(l.flow_slug order by l.ord) filter (where l.live and l.plain) as flow_slugs,
    array_agg(l.step_slug order by l.ord) filter (where l.live and l.plain) as step_slugs,
    array_agg(l.output order by l.ord) filter (where l.live and l.plain) as outputs,
    array_agg(l.task_row order by l.ord) filter (where l.live and l.plain) as task_rows,
    array_agg(l.state_row order by l.ord) filter (where l.live and l.plain) as state_rows,
    array_agg(l.ord order by l.ord) filter (where l.live and not l.plain) as general,
    -- Map tasks that do not finish their step here (fewer of its tasks in the batch than it has
    -- left) only count down their step.
    array_agg(l.ord order by l.ord) filter (where l.live and l.mapped) as map_positions,
    array_agg(l.task_row order by l.ord) filter (where l.live and l.mapped) as map_task_rows,
    array_agg(l.state_row order by l.ord) filter (where l.live and l.mapped) as map_state_rows,
    array_agg(l.remaining_tasks order by l.ord) filter (where l.live and l.mapped) as map_remaining
  into v_batch
  from locked as l;

  -- GUARD: every task must exist; the error names the first missing one, as complete_task would.
  if v_batch.found < v_count then
    select u.run_id, u.step_slug, u.task_index into v_missing
    from unnest(run_ids, step_slugs, task_indexes) with ordinality as u (run_id, step_slug, task_index, ord)
    where not exists (
      select 1 from pgflow.step_tasks as t
      where t.run_id = u.run_id and t.step_slug = u.step_slug and t.task_index = u.task_index
    )
    order by u.ord
    limit 1;
    if not exists (select 1 from pgflow.runs as r where r.run_id = v_missing.run_id) then
      raise exception 'Run % does not exist.', v_missing.run_id using errcode = 'P0002';
    end if;
    raise exception 'Task % of step "%" in run % does not exist.', v_missing.task_index,
      v_missing.step_slug, v_missing.run_id using errcode = 'P0002';
  end if;

  -- GUARD: a task named twice is completed once, by the general path (the repeat is a late
  -- callback there).
  if v_batch.distinct_found < v_count then
    v_general := array(select generate_series(1, v_count));
  else
    v_general := v_batch.general;
    -- The map tasks of a step with more tasks left than the batch holds complete set-based:
    -- their step only counts down, as complete_task would do for each (no event, no child).
    select array_agg(x.ord order by x.ord), array_agg(x.task_row order by x.ord),
      array_agg(x.state_row order by x.ord)
    into v_map_positions, v_map_task_rows, v_map_state_rows
    from (
      select m.ord, m.task_row, m.state_row, m.remaining,
        count(*) over (partition by m.state_row) as in_batch
      from unnest(v_batch.map_positions, v_batch.map_task_rows, v_batch.map_state_rows,
        v_batch.map_remaining) as m (ord, task_row, state_row, remaining)
    ) as x
    where x.in_batch < x.remaining;
    if v_map_positions is not null then
      v_general := array(select g from unnest(v_general) as g where not (g = any (v_map_positions)));
      if cardinality(v_general) = 0 then
        v_general := null;
      end if;
    end if;
  end if;

  if v_batch.positions is not null and v_batch.distinct_found = v_count then
    -- Tasks, their steps, the children's dependency counts (a child whose last dependencies
    -- all finish in this batch starts once) and the runs' step counts, in one statement.
    with fast as (
      select f.*
      from unnest(v_batch.positions, v_batch.run_ids, v_batch.flow_slugs, v_batch.step_slugs,
        v_batch.outputs, v_batch.task_rows, v_batch.state_rows)
        as f (position, run_id, flow_slug, step_slug, output, task_row, state_row)
    ),
    done as (
      update pgflow.step_tasks as t
      set status = 'completed', output = f.output, completed_at = clock_timestamp()
      from fast as f
      where t.ctid = any (v_batch.task_rows) and t.ctid = f.task_row
      returning t.queue_name, t.message_id
    ),
    closed as (
      update pgflow.step_states as ss
      set status = 'completed', output = f.output, remaining_tasks = 0, completed_at = clock_timestamp()
      from fast as f
      where ss.ctid = any (v_batch.state_rows) and ss.ctid = f.state_row
    ),
    edges as (
      -- last: the batch position of the child's last finishing parent (where its start belongs).
      select f.run_id, d.step_slug, count(*)::int as finished, max(f.position) as last
      from fast as f
      join pgflow.deps as d on d.flow_slug = f.flow_slug and d.dep_slug = f.step_slug
      group by f.run_id, d.step_slug
    ),
    children as (
      update pgflow.step_states as c
      set remaining_deps = c.remaining_deps - e.finished,
        status = case when c.remaining_deps = e.finished then 'started' else c.status end,
        started_at = case when c.remaining_deps = e.finished then clock_timestamp() else c.started_at end,
        remaining_tasks = case when c.remaining_deps = e.finished then c.initial_tasks else c.remaining_tasks end
      from edges as e
      where c.run_id = e.run_id and c.step_slug = e.step_slug and c.status = 'created'
      returning c.run_id, c.flow_slug, c.step_slug, c.remaining_deps, e.last
    ),
    counted as (
      update pgflow.runs as r set remaining_steps = r.remaining_steps - n.finished
      from (select f.run_id, count(*)::int as finished from fast as f group by f.run_id) as n
      where r.run_id = n.run_id
      returning r.run_id, r.remaining_steps
    )
    select array_agg(c.run_id order by c.run_id, s.step_index) as run_ids,
      array_agg(c.flow_slug order by c.run_id, s.step_index) as flow_slugs,
      array_agg(c.step_slug order by c.run_id, s.step_index) as step_slugs,
      array_agg(s.queue_name order by c.run_id, s.step_index) as queue_names,
      array_agg(coalesce(s.opt_start_delay, 0) order by c.run_id, s.step_index) as delays,
      array_agg(c.last order by c.run_id, s.step_index) as positions,
      array_agg(s.step_index order by c.run_id, s.step_index) as step_indexes,
      (select array_agg(n.run_id) from counted as n where n.remaining_steps = 0) as finished_runs,
      (select array_agg(d.queue_name order by d.message_id) from done as d) as done_queues,
      (select array_agg(d.message_id order by d.message_id) from done as d) as done_messages
    into v_started
    from children as c
    join pgflow.steps as s on s.flow_slug = c.flow_slug and s.step_slug = c.step_slug
    where c.remaining_deps = 0;

    -- One message per started child (a single step has one task), one insert per queue; the
    -- task rows are paired with their messages by the task key the message carries.
    for v_queue in select distinct q.name from unnest(v_started.queue_names) as q (name) order by 1 loop
      execute format(
        $q$
          with sent as (
            insert into pgmq.%I (vt, message)
            select clock_timestamp() + make_interval(secs => x.delay),
              jsonb_build_object('flow_slug', x.flow_slug, 'run_id', x.run_id, 'step_slug', x.step_slug, 'task_index', 0)
            from unnest($1::uuid[], $2::text[], $3::text[], $4::int[], $5::text[])
              as x (run_id, flow_slug, step_slug, delay, queue_name)
            where x.queue_name = $6
            returning msg_id, message
          )
          insert into pgflow.step_tasks (run_id, flow_slug, step_slug, task_index, message_id, queue_name)
          select (s.message ->> 'run_id')::uuid, s.message ->> 'flow_slug', s.message ->> 'step_slug', 0,
            s.msg_id, $6
          from sent as s
        $q$,
        pgflow.pgmq_table_name(v_queue)
      )
      using v_started.run_ids, v_started.flow_slugs, v_started.step_slugs, v_started.delays,
        v_started.queue_names, v_queue;
    end loop;

    -- The completed tasks' messages are archived at once, one call per queue.
    for v_queue in select distinct q.name from unnest(v_started.done_queues) as q (name) order by 1 loop
      perform pgmq.archive(v_queue, array(
        select m.message_id from unnest(v_started.done_queues, v_started.done_messages) as m (queue_name, message_id)
        where m.queue_name = v_queue));
    end loop;

    -- The events pgflow._emit_event would send, in one statement, and on each run's channel in
    -- the order completing these tasks one by one would send them: a completion, then the
    -- starts it caused.
    perform pg_notify(
      'pgflow_run_' || replace(e.run_id::text, '-', ''),
      json_build_object('event', e.event, 'run_id', e.run_id, 'step_slug', e.step_slug, 'status', e.status)::text
    )
    from (
      select f.position, 1 as phase, 0 as step_index, f.run_id, 'step:completed' as event, f.step_slug,
        'completed' as status
      from unnest(v_batch.positions, v_batch.run_ids, v_batch.step_slugs) as f (position, run_id, step_slug)
      union all
      select c.position, 2, c.step_index, c.run_id, 'step:started', c.step_slug, 'started'
      from unnest(v_started.positions, v_started.step_indexes, v_started.run_ids, v_started.step_slugs)
        as c (position, step_index, run_id, step_slug)
    ) as e
    order by e.position, e.phase, e.step_index;

    -- Runs with no step left complete, as pgflow._maybe_complete_run does for one.
    if v_started.finished_runs is not null then
      with finished as (
        update pgflow.runs as r
        set status = 'completed', completed_at = clock_timestamp(), output = (
          select jsonb_object_agg(ss.step_slug, ss.output)
          from pgflow.step_states as ss
          where ss.run_id = r.run_id and ss.status = 'completed'
            and not exists (
              select 1 from pgflow.deps as d where d.flow_slug = ss.flow_slug and d.dep_slug = ss.step_slug
            )
        )
        -- By key alone: these runs are started and locked (their tasks were live), and a
        -- condition on the status would let a generic plan walk the index of started runs.
        where r.run_id = any (v_started.finished_runs) and r.remaining_steps = 0
        returning r.run_id
      )
      select array_agg(f.run_id order by f.run_id) into v_finished from finished as f;
      perform pg_notify(
        'pgflow_run_' || replace(f.run_id::text, '-', ''),
        json_build_object('event', 'run:completed', 'run_id', f.run_id, 'step_slug', null, 'status', 'completed')::text
      )
      from unnest(v_finished) as f (run_id);
    end if;
  end if;

  if v_map_positions is not null then
    with counted as (
      update pgflow.step_states as ss set remaining_tasks = ss.remaining_tasks - c.n
      from (
        select m.state_row, count(*)::int as n from unnest(v_map_state_rows) as m (state_row)
        group by m.state_row
      ) as c
      where ss.ctid = any (v_map_state_rows) and ss.ctid = c.state_row
    ),
    done as (
      update pgflow.step_tasks as t
      set status = 'completed', output = outputs[m.ord], completed_at = clock_timestamp()
      from unnest(v_map_positions, v_map_task_rows) as m (ord, task_row)
      where t.ctid = any (v_map_task_rows) and t.ctid = m.task_row
      returning t.queue_name, t.message_id
    )
    select array_agg(d.queue_name order by d.message_id), array_agg(d.message_id order by d.message_id)
    into v_map_queues, v_map_messages
    from done as d;
    for v_queue in select distinct q.name from unnest(v_map_queues) as q (name) order by 1 loop
      perform pgmq.archive(v_queue, array(
        select m.message_id from unnest(v_map_queues, v_map_messages) as m (queue_name, message_id)
        where m.queue_name = v_queue));
    end loop;
  end if;

  if v_general is not null then
    foreach i in array v_general loop
      perform pgflow.complete_task(run_ids[i], step_slugs[i], task_indexes[i], outputs[i], v_attempts[i]);
    end loop;
  end if;

  return query
  select t.*
  from unnest(run_ids, step_slugs, task_indexes) with ordinality as u (run_id, step_slug, task_index, ord)
  join pgflow.step_tasks as t
    on t.run_id = u.run_id and t.step_slug = u.step_slug and t.task_index = u.task_index
  order by u.ord;
end;
$$;

-- Starts many runs of one flow in one call (engine 0014), as start_flow would for each input in
-- turn, in one transaction, and returns the runs in input order. With idempotency_keys (one per
-- input, null elements for none), an input whose key some run of this flow already has returns
-- that run as it is and starts nothing (so does a key repeated in the call: its first input
-- wins), also when calls race. Set-based when every root step is a single step without a
-- condition (one message insert per root step for all runs); otherwise each new run moves
-- forward as start_flow moves one. An input that is SQL NULL, or not an array where a root map
-- step maps it, raises naming its position (from 1), and nothing starts.
-- Holds the flow's definition lock shared, as start_flow does.
create function pgflow.start_flows(flow_slug text, inputs jsonb[], idempotency_keys text[] default null)
returns setof pgflow.runs
language plpgsql
volatile
set search_path = ''
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
as $$
-- The conflict target names columns that are parameters too; every other use is qualified.
#variable_conflict use_column
declare
  v_count int := coalesce(cardinality(inputs), 0);
  v_root_map text;
  v_bad record;
  v_ids uuid[];
  v_new uuid[];
  v_plain boolean;
  v_root record;
begin
  perform pg_advisory_xact_lock_shared(1, hashtext(lower(flow_slug)));
  if not exists (select 1 from pgflow.flows as f where f.flow_slug = start_flows.flow_slug) then
    raise exception 'Flow "%" does not exist.', flow_slug
      using errcode = 'P0002', hint = 'Check the slug (it is case-sensitive) or compile the flow first.';
  end if;
  if v_count = 0 then
    return;
  end if;
  if array_ndims(inputs) <> 1 or array_lower(inputs, 1) <> 1
    or (idempotency_keys is not null and (cardinality(idempotency_keys) <> v_count
      or array_ndims(idempotency_keys) <> 1 or array_lower(idempotency_keys, 1) <> 1)) then
    raise exception 'start_flows needs one-dimensional arrays that start at index 1, one key per input (got % inputs, % keys).',
      v_count, coalesce(cardinality(idempotency_keys), 0)
      using errcode = '22023';
  end if;
  -- GUARD: every input is checked before anything is written.
  select i.n into v_bad from unnest(inputs) with ordinality as i (input, n)
  where i.input is null order by i.n limit 1;
  if found then
    raise exception 'Input % of the runs of flow "%" must not be SQL NULL.', v_bad.n, flow_slug
      using errcode = '22004', hint = 'Pass a JSON value; ''null''::jsonb is a valid JSON input.';
  end if;
  select s.step_slug into v_root_map from pgflow.steps as s
  where s.flow_slug = start_flows.flow_slug and s.step_type = 'map' and s.deps_count = 0
  order by s.step_index limit 1;
  if v_root_map is not null then
    select i.n, jsonb_typeof(i.input) as kind into v_bad from unnest(inputs) with ordinality as i (input, n)
    where jsonb_typeof(i.input) <> 'array' order by i.n limit 1;
    if found then
      raise exception 'Flow "%" maps its input in step "%", so input % must be a JSON array, got %.',
        flow_slug, v_root_map, v_bad.n, v_bad.kind
        using errcode = '22023';
    end if;
  end if;

  v_ids := array(select gen_random_uuid() from generate_series(1, v_count));
  with started as (
    insert into pgflow.runs (run_id, flow_slug, input, remaining_steps, idempotency_key)
    select w.run_id, start_flows.flow_slug, w.input,
      (select count(*) from pgflow.steps as s where s.flow_slug = start_flows.flow_slug), w.key
    from unnest(v_ids, inputs, coalesce(idempotency_keys, array_fill(null::text, array[v_count])))
      with ordinality as w (run_id, input, key, n)
    order by w.n
    on conflict (flow_slug, idempotency_key) where idempotency_key is not null do nothing
    returning run_id
  )
  select coalesce(array_agg(s.run_id), '{}') into v_new from started as s;

  if cardinality(v_new) > 0 then
    select count(*) > 0 and bool_and(s.step_type = 'single' and s.required_input_pattern is null
        and s.forbidden_input_pattern is null) into v_plain
    from pgflow.steps as s where s.flow_slug = start_flows.flow_slug and s.deps_count = 0;
    -- Plain root steps start in the same statement (each has its one task, queued below).
    insert into pgflow.step_states (run_id, flow_slug, step_slug, remaining_deps, initial_tasks,
      status, started_at, remaining_tasks)
    select r.run_id, s.flow_slug, s.step_slug, s.deps_count,
      case
        when s.step_type in ('single', 'signal') then 1
        when s.deps_count = 0 then jsonb_array_length(r.input)
      end,
      case when v_plain and s.deps_count = 0 then 'started' else 'created' end,
      case when v_plain and s.deps_count = 0 then clock_timestamp() end,
      case when v_plain and s.deps_count = 0 then 1 end
    from pgflow.runs as r
    join pgflow.steps as s on s.flow_slug = r.flow_slug
    where r.run_id = any (v_new);
    perform pg_notify(
      'pgflow_run_' || replace(r.run_id::text, '-', ''),
      json_build_object('event', 'run:started', 'run_id', r.run_id, 'step_slug', null, 'status', 'started')::text
    )
    from unnest(v_new) as r (run_id);

    if v_plain then
      -- Every root step starts with one task in every new run: one message insert per root
      -- step, its task rows paired with their messages by the task key the message carries.
      for v_root in
        select s.step_slug, s.queue_name, coalesce(s.opt_start_delay, 0) as delay
        from pgflow.steps as s
        where s.flow_slug = start_flows.flow_slug and s.deps_count = 0
        order by s.step_index
      loop
        execute format(
          $q$
            with sent as (
              insert into pgmq.%I (vt, message)
              select clock_timestamp() + make_interval(secs => $1),
                jsonb_build_object('flow_slug', $2, 'run_id', r.run_id, 'step_slug', $3, 'task_index', 0)
              from unnest($4::uuid[]) as r (run_id)
              returning msg_id, message
            )
            insert into pgflow.step_tasks (run_id, flow_slug, step_slug, task_index, message_id, queue_name)
            select (s.message ->> 'run_id')::uuid, $2, $3, 0, s.msg_id, $5
            from sent as s
          $q$,
          pgflow.pgmq_table_name(v_root.queue_name)
        )
        using v_root.delay, flow_slug, v_root.step_slug, v_new, v_root.queue_name;
        perform pg_notify(
          'pgflow_run_' || replace(r.run_id::text, '-', ''),
          json_build_object('event', 'step:started', 'run_id', r.run_id, 'step_slug', v_root.step_slug,
            'status', 'started')::text
        )
        from unnest(v_new) as r (run_id);
      end loop;
    else
      perform pgflow._advance_run(r.run_id) from unnest(v_new) as r (run_id);
    end if;
  end if;

  return query
  select r.*
  from unnest(v_ids, idempotency_keys) with ordinality as w (run_id, key, n)
  cross join lateral (
    select x.* from pgflow.runs as x where x.run_id = w.run_id
    union all
    select x.* from pgflow.runs as x
    where w.key is not null and x.flow_slug = start_flows.flow_slug and x.idempotency_key = w.key
    limit 1
  ) as r
  order by w.n;
end;
$$;

-- What completions recorded for the next claim before this migration is archived now; nothing
-- records any more.
select pgflow.archive_completed_messages();

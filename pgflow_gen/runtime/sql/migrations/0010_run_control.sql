-- Engine migration 0010: run control. Cancelling a run, idempotent starts, pausing a step.
--
-- pgflow.cancel_run(run_id, reason) ends a started run as cancelled, a new terminal status of
-- runs and step states (tasks had it already: a failed run cancels its unfinished tasks). The
-- run keeps when and why (runs.cancelled_at, runs.cancel_reason); its unfinished steps and tasks
-- become cancelled, its queued and running tasks' messages are archived, and the late callbacks
-- of its running tasks change nothing, as for any finished run. Workers hear it on their queue's
-- insert channel (a JSON payload: {"event": "run:cancelled", "run_id": ...}) and stop the run's
-- handlers; a worker of an earlier release only wakes up, and its late result is ignored.
-- pgflow.prune_data_older_than deletes cancelled runs as it deletes failed ones.
--
-- pgflow.start_flow takes an idempotency_key (a fourth parameter, default null; runs keep it in
-- runs.idempotency_key, unique per flow): a second start of the flow with the same key returns
-- the existing run and starts nothing, also when the starts race. Calls with two or three
-- arguments are unchanged.
--
-- pgflow.pause_step(flow_slug, step_slug, reason) and pgflow.resume_step(flow_slug, step_slug):
-- while a step is paused (pgflow.step_pauses), claim_tasks starts none of its tasks; it holds the
-- messages it read of it out of sight for 60 s at a time, lists them (pgflow.held_messages) and
-- names them in a notice; resume_step shows exactly those again at once.
--
-- Workers and clients of any release run on it (a worker of an earlier release takes the held
-- messages of a paused step for foreign ones, and says so in a warning).

alter domain pgflow.run_status drop constraint run_status_is_known;
alter domain pgflow.run_status add constraint run_status_is_known
  check (value in ('started', 'completed', 'failed', 'cancelled'));

alter domain pgflow.step_status drop constraint step_status_is_known;
alter domain pgflow.step_status add constraint step_status_is_known check (
    value in ('created', 'started', 'completed', 'failed', 'skipped', 'cancelled')
  );

alter table pgflow.runs
  add column cancelled_at timestamptz,
  add column cancel_reason text,
  add column idempotency_key text;
create unique index runs_idempotency_key_idx on pgflow.runs (flow_slug, idempotency_key)
  where idempotency_key is not null;

-- Cancels a started run: the run becomes cancelled (with cancelled_at and the reason), every
-- step that had not finished becomes cancelled, and so does every queued or started task, whose
-- message is archived. Late callbacks of its tasks change nothing (their task is no longer
-- started), and no step of it starts again. One event, run:cancelled; and the queues of the
-- tasks that were running are told (their workers listen there), so the handlers stop.
-- A run that is not started raises (object_not_in_prerequisite_state) and changes nothing.
-- Locks the run, its step states and its tasks, in that order, as every callback does.
create function pgflow.cancel_run(run_id uuid, reason text default null)
returns pgflow.runs
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_run pgflow.runs;
  v_queues text[];
  v_messages bigint[];
  v_running text[];
  v_queue text;
begin
  select * into v_run from pgflow.runs as r where r.run_id = cancel_run.run_id for update;
  if not found then
    raise exception 'Run % does not exist.', run_id using errcode = 'P0002';
  end if;
  if v_run.status <> 'started' then
    raise exception 'Run % is % already; only a started run can be cancelled.', run_id, v_run.status
      using errcode = '55000', hint = 'Nothing was changed.';
  end if;

  perform 1 from pgflow.step_states as ss
  where ss.run_id = cancel_run.run_id and ss.status in ('created', 'started')
  order by ss.step_slug
  for update;
  update pgflow.step_states as ss set status = 'cancelled', remaining_tasks = null
  where ss.run_id = cancel_run.run_id and ss.status in ('created', 'started');

  with locked as (
    select t.step_slug, t.task_index, t.status
    from pgflow.step_tasks as t
    where t.run_id = cancel_run.run_id and t.status in ('queued', 'started')
    order by t.step_slug, t.task_index
    for update
  ),
  cancelled as (
    update pgflow.step_tasks as t set status = 'cancelled'
    from locked
    where t.run_id = cancel_run.run_id and t.step_slug = locked.step_slug
      and t.task_index = locked.task_index and t.status in ('queued', 'started')
    returning t.queue_name, t.message_id, locked.status as was
  )
  select array_agg(c.queue_name), array_agg(c.message_id),
    array_agg(distinct c.queue_name) filter (where c.was = 'started')
  into v_queues, v_messages, v_running
  from cancelled as c;
  perform pgflow._archive_task_messages(v_queues, v_messages);

  update pgflow.runs as r
  set status = 'cancelled', cancelled_at = clock_timestamp(), cancel_reason = cancel_run.reason
  where r.run_id = cancel_run.run_id
  returning * into v_run;

  perform pgflow._emit_event(run_id, 'run:cancelled', null, 'cancelled');
  -- Workers listen on their queue's insert channel; a payload tells this apart from an insert.
  foreach v_queue in array coalesce(v_running, '{}') loop
    perform pg_notify(
      'pgmq.' || pgflow.pgmq_table_name(v_queue) || '.INSERT',
      json_build_object('event', 'run:cancelled', 'run_id', run_id)::text
    );
  end loop;
  return v_run;
end;
$$;

-- Maintenance: deletes finished runs (completed, failed or cancelled before now - retention) with their step
-- states, tasks and the tasks' messages still in a queue, workers silent for longer than retention, and archived messages older than
-- retention in every queue a flow owns (its steps' routes, plus the default queue of a flow-mode
-- flow), found by their canonical archive table names without listing queues. Running runs are
-- never touched, whatever their age.
create or replace function pgflow.prune_data_older_than(retention interval)
returns jsonb
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_cutoff timestamptz := now() - retention;
  v_runs uuid[];
  v_queue text;
  v_workers int;
  v_archived int := 0;
  v_count int;
  v_queues text[];
  v_messages bigint[];
begin
  if retention is null or retention < interval '0' then
    raise exception 'Retention must be a non-negative interval, got %.', retention using errcode = '22023';
  end if;

  perform pgflow.archive_completed_messages();

  -- Same lock order as the task callbacks: runs first; a run busy right now is pruned next time.
  v_runs := array(
    select r.run_id from pgflow.runs as r
    where (r.status = 'completed' and r.completed_at < v_cutoff)
       or (r.status = 'failed' and r.failed_at < v_cutoff)
       or (r.status = 'cancelled' and r.cancelled_at < v_cutoff)
    order by r.run_id
    for update skip locked
  );
  if cardinality(v_runs) = 0 then
    v_runs := null;
  end if;

  if v_runs is not null then
    -- The tasks' messages still in their queues go with them, or they would come back after every
    -- lease with no task to claim (a run failed by hand, a task parked by stall recovery).
    with gone as (
      delete from pgflow.step_tasks as t where t.run_id = any (v_runs)
      returning t.queue_name, t.message_id
    )
    select array_agg(g.queue_name), array_agg(g.message_id) into v_queues, v_messages
    from gone as g where g.message_id is not null;
    for v_queue in select distinct q from unnest(v_queues) as q loop
      continue when to_regclass(format('pgmq.%I', pgflow.pgmq_table_name(v_queue))) is null;
      perform pgmq.delete(v_queue, array(
        select x.m from unnest(v_queues, v_messages) as x (q, m) where x.q = v_queue
      ));
    end loop;
    delete from pgflow.step_states as ss where ss.run_id = any (v_runs);
    delete from pgflow.runs as r where r.run_id = any (v_runs);
  end if;

  delete from pgflow.workers as w where w.last_heartbeat_at < v_cutoff;
  get diagnostics v_workers = row_count;

  for v_queue in
    select s.queue_name from pgflow.steps as s
    union
    select pgflow.default_queue_name(f.flow_slug) from pgflow.flows as f where f.queue_mode = 'flow'
  loop
    continue when to_regclass(format('pgmq.%I', pgflow.pgmq_table_name(v_queue, 'a'))) is null;
    execute format('delete from pgmq.%I where archived_at < $1', pgflow.pgmq_table_name(v_queue, 'a'))
      using v_cutoff;
    get diagnostics v_count = row_count;
    v_archived := v_archived + v_count;
  end loop;

  return jsonb_build_object(
    'runs', coalesce(cardinality(v_runs), 0), 'workers', v_workers, 'archived_messages', v_archived
  );
end;
$$;

-- The old signature goes: with both, a call with two or three arguments would be ambiguous.
drop function pgflow.start_flow(text, jsonb, uuid);

-- Starts a run: one step state per step, then every ready step moves forward at once (conditions,
-- empty maps, first messages). A flow with a root map needs an array input. Returns the run.
-- Holds the flow's definition lock shared, so the definition cannot change while it is read.
-- With an idempotency_key, a run of this flow with that key is returned as it is (whatever its
-- input and status) and nothing starts; concurrent starts with one key make one run (the unique
-- index decides; under repeatable read the loser gets a serialization failure, to be retried).
create function pgflow.start_flow(
  flow_slug text, input jsonb, run_id uuid default null, idempotency_key text default null
)
returns setof pgflow.runs
language plpgsql
volatile
set search_path = ''
as $$
-- The conflict target names columns that are parameters too; every other use is qualified.
#variable_conflict use_column
declare
  v_run_id uuid := coalesce(run_id, gen_random_uuid());
  v_root_map text;
  v_input_length int;
begin
  perform pg_advisory_xact_lock_shared(1, hashtext(lower(flow_slug)));
  if not exists (select 1 from pgflow.flows as f where f.flow_slug = start_flow.flow_slug) then
    raise exception 'Flow "%" does not exist.', flow_slug
      using errcode = 'P0002', hint = 'Check the slug (it is case-sensitive) or compile the flow first.';
  end if;
  if idempotency_key is not null then
    return query select * from pgflow.runs as r
      where r.flow_slug = start_flow.flow_slug and r.idempotency_key = start_flow.idempotency_key;
    if found then
      return;
    end if;
  end if;
  if input is null then
    raise exception 'The input of a run of flow "%" must not be SQL NULL.', flow_slug
      using errcode = '22004', hint = 'Pass a JSON value; ''null''::jsonb is a valid JSON input.';
  end if;
  select s.step_slug into v_root_map from pgflow.steps as s
  where s.flow_slug = start_flow.flow_slug and s.step_type = 'map' and s.deps_count = 0
  order by s.step_index limit 1;
  if v_root_map is not null and jsonb_typeof(input) <> 'array' then
    raise exception 'Flow "%" maps its input in step "%", so the input must be a JSON array, got %.',
      flow_slug, v_root_map, jsonb_typeof(input)
      using errcode = '22023';
  end if;
  if jsonb_typeof(input) = 'array' then
    v_input_length := jsonb_array_length(input);
  end if;

  insert into pgflow.runs (run_id, flow_slug, input, remaining_steps, idempotency_key)
  values (v_run_id, flow_slug, input,
    (select count(*) from pgflow.steps as s where s.flow_slug = start_flow.flow_slug),
    idempotency_key)
  on conflict (flow_slug, idempotency_key) where idempotency_key is not null do nothing;
  if not found then  -- a concurrent start with this key won: its run is the one
    return query select * from pgflow.runs as r
      where r.flow_slug = start_flow.flow_slug and r.idempotency_key = start_flow.idempotency_key;
    return;
  end if;

  insert into pgflow.step_states (run_id, flow_slug, step_slug, remaining_deps, initial_tasks)
  select v_run_id, s.flow_slug, s.step_slug, s.deps_count,
    case
      when s.step_type = 'single' then 1
      when s.deps_count = 0 then v_input_length
    end
  from pgflow.steps as s
  where s.flow_slug = start_flow.flow_slug;

  perform pgflow._emit_event(v_run_id, 'run:started', null, 'started');
  perform pgflow._advance_run(v_run_id);

  return query select * from pgflow.runs as r where r.run_id = v_run_id;
end;
$$;

-- Paused steps (pgflow.pause_step): while a step is listed here no task of it starts, in any
-- run; its messages stay queued and use no attempt. pgflow.resume_step removes it.
create table pgflow.step_pauses (
  flow_slug text not null,
  step_slug text not null,
  reason text,
  paused_at timestamptz not null default now(),
  primary key (flow_slug, step_slug),
  foreign key (flow_slug, step_slug) references pgflow.steps (flow_slug, step_slug) on delete cascade
);

-- The messages of a paused step that claims have read and put out of sight (for HOLD seconds at
-- a time; pgflow.claim_tasks), so that resume_step can show exactly these again at once, and not
-- the messages that wait for a retry's delay. Gone with the pause.
create table pgflow.held_messages (
  queue_name text not null,
  message_id bigint not null,
  flow_slug text not null,
  step_slug text not null,
  primary key (queue_name, message_id),
  foreign key (flow_slug, step_slug) references pgflow.step_pauses (flow_slug, step_slug)
    on delete cascade
);

create index held_messages_step_idx on pgflow.held_messages (flow_slug, step_slug);

-- Raises no_data_found unless the flow has the step (for the functions that name one).
create function pgflow._require_step(flow_slug text, step_slug text)
returns void
language plpgsql
stable
set search_path = ''
as $$
begin
  if not exists (select 1 from pgflow.flows as f where f.flow_slug = _require_step.flow_slug) then
    raise exception 'Flow "%" does not exist.', flow_slug
      using errcode = 'P0002', hint = 'Check the slug (it is case-sensitive) or compile the flow first.';
  end if;
  if not exists (
    select 1 from pgflow.steps as s
    where s.flow_slug = _require_step.flow_slug and s.step_slug = _require_step.step_slug
  ) then
    raise exception 'Flow "%" has no step "%".', flow_slug, step_slug
      using errcode = 'P0002', hint = 'Step slugs are case-sensitive; `pgflow-gen flows` lists them.';
  end if;
end;
$$;

-- Pauses a step of a flow: from now on no task of it starts, in any run and in either queue mode
-- (claims hold its messages, which use no attempt); tasks already started finish; the other steps
-- go on. Pausing a paused step keeps its paused_at and takes the new reason. Returns the pause.
create function pgflow.pause_step(flow_slug text, step_slug text, reason text default null)
returns pgflow.step_pauses
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_pause pgflow.step_pauses;
begin
  perform pgflow._require_step(flow_slug, step_slug);
  insert into pgflow.step_pauses (flow_slug, step_slug, reason)
  values (pause_step.flow_slug, pause_step.step_slug, pause_step.reason)
  on conflict on constraint step_pauses_pkey do update set reason = excluded.reason
  returning * into v_pause;
  return v_pause;
end;
$$;

-- Resumes a paused step: its held messages are visible again at once (those waiting for a
-- retry's delay keep waiting) and its queues' workers are woken, so its tasks start now. Resuming a step that
-- is not paused changes nothing. Returns how many messages were shown again.
-- Locks the held messages' task rows before their PGMQ rows, as every claim does.
create function pgflow.resume_step(flow_slug text, step_slug text)
returns int
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_queue text;
  v_messages bigint[];
  v_count int;
  v_shown int := 0;
begin
  perform pgflow._require_step(flow_slug, step_slug);
  for v_queue, v_messages in
    with locked as (
      select t.queue_name, t.message_id
      from pgflow.held_messages as m
      join pgflow.step_tasks as t on t.queue_name = m.queue_name and t.message_id = m.message_id
      where m.flow_slug = resume_step.flow_slug and m.step_slug = resume_step.step_slug
        and t.status = 'queued'
      order by t.run_id, t.step_slug, t.task_index
      for update of t
    )
    select l.queue_name, array_agg(l.message_id order by l.message_id)
    from locked as l
    group by l.queue_name
  loop
    select count(*) into v_count
    from pgflow.set_vt_batch(v_queue, v_messages, array_fill(0, array[cardinality(v_messages)]));
    v_shown := v_shown + v_count;
    -- Wake the queue's workers as an insert would, rather than leave it to their next poll.
    perform pg_notify('pgmq.' || pgflow.pgmq_table_name(v_queue) || '.INSERT', '');
  end loop;
  delete from pgflow.step_pauses as p
  where p.flow_slug = resume_step.flow_slug and p.step_slug = resume_step.step_slug;
  return v_shown;
end;
$$;

-- The claim, phase two of reading a task: of the messages a worker read from queue_name, claims the
-- queued tasks of this flow whose run and step are started, extends each message's visibility to
-- the step's timeout + 2 s, and returns the tasks with their inputs, the attempt each claim
-- started (the fencing token of the task's callbacks) and the step's effective timeout.
-- Task rows locked by someone else are skipped (their message comes back later), so a claim never
-- waits; then PGMQ rows are locked. First it archives the queue's batch of completed tasks'
-- messages.
-- The selector follows the flow's queue mode: a step-queued flow claims only tasks of step_slug,
-- which must name a step exactly and queue_name its exact route; a flow-mode flow takes no step.
-- A wrong selector raises before anything changes. Messages read of this flow (and step) whose
-- task no longer exists are archived (a warning names them); other foreign ones are left alone.
-- A worker marked stopped, or silent for longer than the liveness rule's live_within, that claims
-- is registered again (a claim proves it alive).
-- Tasks of a paused step (pgflow.step_pauses) are not claimed: their messages are held out of
-- sight for 60 s at a time and listed in pgflow.held_messages (resume_step shows them again at
-- once), and a notice names them (JSON detail: held_message_ids), so a worker does not take them
-- for foreign messages.
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
  v_queue text := lower(queue_name);
  v_mode text;
  v_route text;
  v_twin text;
  v_run_ids uuid[];
  v_step_slugs text[];
  v_task_indexes int[];
  v_message_ids bigint[];
  v_attempts int[];
  v_timeouts int[];
  v_visible_set int;
  v_orphans bigint[];
  v_stopped_at timestamptz;
  v_heartbeat_at timestamptz;
  v_held bigint[];
begin
  if queue_name is null then
    raise exception 'A claim needs the queue the messages were read from.' using errcode = '22004';
  end if;
  select f.queue_mode into v_mode from pgflow.flows as f where f.flow_slug = claim_tasks.flow_slug;
  if not found then
    raise exception 'Flow "%" does not exist.', flow_slug using errcode = 'P0002';
  end if;
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
    where s.flow_slug = claim_tasks.flow_slug and s.step_slug = claim_tasks.step_slug;
    if not found then
      select s.step_slug into v_twin from pgflow.steps as s
      where s.flow_slug = claim_tasks.flow_slug and lower(s.step_slug) = lower(claim_tasks.step_slug);
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
    v_queue := v_route;
  end if;
  if msg_ids is null or cardinality(msg_ids) = 0 then
    return;
  end if;
  select w.stopped_at, w.last_heartbeat_at into v_stopped_at, v_heartbeat_at
  from pgflow.workers as w where w.worker_id = claim_tasks.worker_id;
  if not found then
    raise exception 'Worker % is not registered.', worker_id
      using errcode = 'P0002', hint = 'Register it with pgflow.register_worker() before claiming.';
  end if;
  -- GUARD: a claim proves its worker alive. One marked stopped, or silent for longer than the live
  -- window, is registered again, or stall recovery would take what it claims the moment it does.
  if v_stopped_at is not null
     or v_heartbeat_at < clock_timestamp() - (pgflow.worker_liveness()).live_within then
    update pgflow.workers as w set stopped_at = null, last_heartbeat_at = clock_timestamp()
    where w.worker_id = claim_tasks.worker_id;
  end if;
  perform pgflow.archive_completed_messages(v_queue);

  -- GUARD: a paused step starts no task; what was read of it is held, using no attempt.
  if exists (select 1 from pgflow.step_pauses as p where p.flow_slug = claim_tasks.flow_slug) then
    with held as (
      select t.message_id, t.step_slug
      from pgflow.step_tasks as t
      join pgflow.step_pauses as p on p.flow_slug = t.flow_slug and p.step_slug = t.step_slug
      where t.queue_name = v_queue and t.message_id = any (claim_tasks.msg_ids)
        and t.flow_slug = claim_tasks.flow_slug and t.status = 'queued'
      order by t.run_id, t.step_slug, t.task_index
      -- The pause is held too, so a resume cannot delete it before its messages are listed.
      for update of t skip locked for key share of p
    ),
    listed as (
      insert into pgflow.held_messages (queue_name, message_id, flow_slug, step_slug)
      select v_queue, h.message_id, claim_tasks.flow_slug, h.step_slug from held as h
      on conflict do nothing
    )
    select array_agg(h.message_id order by h.message_id) into v_held from held as h;
    if v_held is not null then
      perform pgflow.set_vt_batch(v_queue, v_held, array_fill(60, array[cardinality(v_held)]));
      raise notice 'claim_tasks held % message(s) of paused steps in queue "%".',
        cardinality(v_held), v_queue
        using detail = jsonb_build_object('held_message_ids', to_jsonb(v_held))::text;
    end if;
  end if;

  -- GUARD: only queued tasks are claimed (a queued task always belongs to a started run and step:
  -- failing a run cancels its tasks, skipping a step skips them); the task row lock decides races.
  with candidates as (
    select t.run_id, t.step_slug, t.task_index
    from pgflow.step_tasks as t
    where t.queue_name = v_queue and t.message_id = any (claim_tasks.msg_ids)
      and t.flow_slug = claim_tasks.flow_slug and t.status = 'queued'
      and (claim_tasks.step_slug is null or t.step_slug = claim_tasks.step_slug)
      and not exists (
        select 1 from pgflow.step_pauses as p
        where p.flow_slug = t.flow_slug and p.step_slug = t.step_slug
      )
    order by t.run_id, t.step_slug, t.task_index
    for update skip locked
  ),
  claimed as (
    update pgflow.step_tasks as t
    set status = 'started', attempts_count = t.attempts_count + 1,
      started_at = clock_timestamp(), last_worker_id = claim_tasks.worker_id,
      claimed_timeout = coalesce(s.opt_timeout, f.opt_timeout), lease_renewed_at = null
    from candidates as c, pgflow.steps as s, pgflow.flows as f
    where t.run_id = c.run_id and t.step_slug = c.step_slug and t.task_index = c.task_index
      and s.flow_slug = t.flow_slug and s.step_slug = t.step_slug and f.flow_slug = t.flow_slug
    returning t.run_id, t.step_slug, t.task_index, t.message_id, t.attempts_count,
      coalesce(s.opt_timeout, f.opt_timeout) as timeout
  )
  select array_agg(c.run_id), array_agg(c.step_slug), array_agg(c.task_index),
    array_agg(c.message_id), array_agg(c.attempts_count), array_agg(c.timeout)
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
      $sql$, pgflow.pgmq_table_name(v_queue))
    into v_orphans using msg_ids, coalesce(v_message_ids, '{}'), claim_tasks.flow_slug, claim_tasks.step_slug;
  end if;
  if v_orphans is not null then
    perform pgmq.archive(v_queue, v_orphans);
    raise warning 'claim_tasks archived % message(s) of queue "%" whose task no longer exists.',
      cardinality(v_orphans), v_queue
      using detail = jsonb_build_object('archived_message_ids', to_jsonb(v_orphans))::text;
  end if;
  if v_message_ids is null then
    return;
  end if;

  -- GUARD: the lease must be in place before any task is returned, or the claim is undone.
  select count(*) into v_visible_set from pgflow.set_vt_batch(v_queue, v_message_ids,
    array(select x.t + 2 from unnest(v_timeouts) with ordinality as x (t, n) order by x.n));
  if v_visible_set <> cardinality(v_message_ids) then
    raise exception 'claim_tasks: % of % claimed messages are missing from queue "%".',
      cardinality(v_message_ids) - v_visible_set, cardinality(v_message_ids), v_queue
      using hint = 'Messages of pgflow queues must only be archived or deleted by pgflow.';
  end if;

  return query
  select claim_tasks.flow_slug, c.run_id, c.step_slug,
    case
      when s.step_type = 'map' and s.deps_count = 0 then r.input -> c.task_index
      when s.step_type = 'map' then (
        select dep.output -> c.task_index
        from pgflow.deps as d
        join pgflow.step_states as dep on dep.run_id = c.run_id and dep.step_slug = d.dep_slug
        where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug
      )
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
    as c (run_id, step_slug, task_index, message_id, attempt, timeout)
  join pgflow.runs as r on r.run_id = c.run_id
  join pgflow.steps as s on s.flow_slug = claim_tasks.flow_slug and s.step_slug = c.step_slug
  order by c.message_id;
end;
$$;

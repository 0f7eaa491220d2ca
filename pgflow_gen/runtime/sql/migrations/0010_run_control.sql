-- Engine migration 0010: run control. Cancelling a run, and idempotent starts.
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
-- Workers and clients of any release run on it.

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

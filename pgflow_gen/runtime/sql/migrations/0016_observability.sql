-- Engine migration 0016: what operators and tracers need.
--
-- pgflow.operator_actions keeps what operators did to runs and steps from the dashboard (cancel,
-- retry, pause, resume, signal), who and when, written in the action's own transaction and shown
-- on the run's timeline. prune_data_older_than deletes a run's actions with the run, and actions
-- on steps once older than the retention; deleting a flow deletes its actions.
--
-- runs.traceparent keeps the W3C trace context of the caller that started a run: start_flow and
-- start_flows read it from the transaction's `pgflow.traceparent` setting (the Python client
-- sets it when OpenTelemetry traces the caller), so that workers make its tasks' spans children
-- of the caller's span. A value that is not a traceparent is ignored. Both functions keep their
-- signatures, so callers of every release work unchanged.
--
-- For the dashboard and metrics, which must not read the whole history: an index on the runs'
-- start time (the runs list, page by page), and pgflow.finished_tasks(since), the tasks that
-- left each queue per step and minute, from the queues' archives.

-- What operators did to runs and steps from the dashboard (engine 0016): cancel, retry, pause,
-- resume, signal; who (the dashboard's actor) and when, written in the action's own transaction
-- and shown on the run's timeline. Pruned with its run (pgflow.prune_data_older_than), and with
-- its flow (the foreign key cascades when pgflow.delete_flow_and_data deletes the flow).
create table pgflow.operator_actions (
  action_id bigint generated always as identity primary key,
  action text not null,
  actor text not null,
  run_id uuid,
  flow_slug text not null references pgflow.flows (flow_slug) on delete cascade,
  step_slug text,
  detail jsonb,
  acted_at timestamptz not null default now()
);

create index operator_actions_run_id_idx on pgflow.operator_actions (run_id);
create index operator_actions_flow_slug_idx on pgflow.operator_actions (flow_slug);

alter table pgflow.runs add column traceparent text;

-- The newest runs first, page by page (the dashboard's runs list, keyset on start time and id).
create index runs_started_at_idx on pgflow.runs (started_at, run_id);

-- Maintenance: deletes finished runs (completed, failed or cancelled before now - retention) with
-- their step states, tasks, operators' actions and the tasks' messages still in a queue; and, older
-- than retention, operators' actions on steps, workers silent that long, and archived messages in
-- every queue a flow owns (its steps' routes, plus the default queue of a flow-mode flow), found
-- by their canonical archive table names without listing queues. Running runs are
-- never touched, whatever their age. With batch_size (engine 0015) one call deletes at most that
-- many runs, and at most that many archived messages per queue, so that a large backlog goes in
-- short transactions (a long one holds back vacuum for every table, the queues' included): the
-- result's "done" is false while something may be left, and the caller calls again.
-- Locks the runs it deletes (skipping locked ones: a run busy right now is pruned next time).
create or replace function pgflow.prune_data_older_than(retention interval, batch_size int default null)
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
  v_done boolean := true;
begin
  if retention is null or retention < interval '0' then
    raise exception 'Retention must be a non-negative interval, got %.', retention using errcode = '22023';
  end if;
  if batch_size < 1 then
    raise exception 'The batch size must be at least 1, got %.', batch_size
      using errcode = '22023', hint = 'Pass null to prune everything in one call.';
  end if;

  perform pgflow.archive_completed_messages();

  -- Same lock order as the task callbacks: runs first; a run busy right now is pruned next time.
  -- In no particular order: sorting every finished run to take a batch would cost more than
  -- deleting it, and skip locked never waits, so the order of these locks cannot deadlock.
  v_runs := array(
    select r.run_id from pgflow.runs as r
    where (r.status = 'completed' and r.completed_at < v_cutoff)
       or (r.status = 'failed' and r.failed_at < v_cutoff)
       or (r.status = 'cancelled' and r.cancelled_at < v_cutoff)
    limit batch_size
    for update skip locked
  );
  if cardinality(v_runs) = batch_size then
    v_done := false;
  end if;
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
    delete from pgflow.operator_actions as a where a.run_id = any (v_runs);
    delete from pgflow.runs as r where r.run_id = any (v_runs);
  end if;
  -- Actions on a step rather than a run (a pause, a resume) go with age.
  delete from pgflow.operator_actions as a where a.run_id is null and a.acted_at < v_cutoff;

  delete from pgflow.workers as w where w.last_heartbeat_at < v_cutoff;
  get diagnostics v_workers = row_count;

  for v_queue in
    select s.queue_name from pgflow.steps as s
    union
    select pgflow.default_queue_name(f.flow_slug) from pgflow.flows as f where f.queue_mode = 'flow'
  loop
    continue when to_regclass(format('pgmq.%I', pgflow.pgmq_table_name(v_queue, 'a'))) is null;
    execute format(
      'delete from pgmq.%1$I where msg_id in'
      ' (select a.msg_id from pgmq.%1$I as a where a.archived_at < $1 limit $2)',
      pgflow.pgmq_table_name(v_queue, 'a'))
      using v_cutoff, batch_size;
    get diagnostics v_count = row_count;
    v_archived := v_archived + v_count;
    if v_count = batch_size then
      v_done := false;
    end if;
  end loop;

  return jsonb_build_object(
    'runs', coalesce(cardinality(v_runs), 0), 'workers', v_workers, 'archived_messages', v_archived,
    'done', v_done
  );
end;
$$;

-- Starts a run: one step state per step, then every ready step moves forward at once (conditions,
-- empty maps, first messages). A flow with a root map needs an array input. Returns the run.
-- Holds the flow's definition lock shared, so the definition cannot change while it is read.
-- With an idempotency_key, a run of this flow with that key is returned as it is (whatever its
-- input and status) and nothing starts; concurrent starts with one key make one run (the unique
-- index decides; under repeatable read the loser gets a serialization failure, to be retried).
-- The run keeps the caller's trace context: the transaction's `pgflow.traceparent` setting when
-- it holds a W3C traceparent (set_config('pgflow.traceparent', ..., true)); anything else is
-- ignored, never an error (engine 0016).
create or replace function pgflow.start_flow(
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
  v_traceparent text := substring(current_setting('pgflow.traceparent', true)
    from '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$');
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

  insert into pgflow.runs (run_id, flow_slug, input, remaining_steps, idempotency_key, traceparent)
  values (v_run_id, flow_slug, input,
    (select count(*) from pgflow.steps as s where s.flow_slug = start_flow.flow_slug),
    idempotency_key, v_traceparent)
  on conflict (flow_slug, idempotency_key) where idempotency_key is not null do nothing;
  if not found then  -- a concurrent start with this key won: its run is the one
    return query select * from pgflow.runs as r
      where r.flow_slug = start_flow.flow_slug and r.idempotency_key = start_flow.idempotency_key;
    return;
  end if;

  insert into pgflow.step_states (run_id, flow_slug, step_slug, remaining_deps, initial_tasks)
  select v_run_id, s.flow_slug, s.step_slug, s.deps_count,
    case
      when s.step_type in ('single', 'signal') then 1
      when s.deps_count = 0 then v_input_length
    end
  from pgflow.steps as s
  where s.flow_slug = start_flow.flow_slug;

  perform pgflow._emit_event(v_run_id, 'run:started', null, 'started');
  perform pgflow._advance_run(v_run_id);

  return query select * from pgflow.runs as r where r.run_id = v_run_id;
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
-- Holds the flow's definition lock shared, as start_flow does, and keeps the caller's trace
-- context as start_flow does (engine 0016).
create or replace function pgflow.start_flows(flow_slug text, inputs jsonb[], idempotency_keys text[] default null)
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
  v_traceparent text := substring(current_setting('pgflow.traceparent', true)
    from '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$');
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
    insert into pgflow.runs (run_id, flow_slug, input, remaining_steps, idempotency_key, traceparent)
    select w.run_id, start_flows.flow_slug, w.input,
      (select count(*) from pgflow.steps as s where s.flow_slug = start_flows.flow_slug), w.key,
      v_traceparent
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

-- How many tasks left each queue the engine's flows own since `since` ago, per minute, and per
-- step unless by_step is false (engine 0016): a task's message is archived when the task
-- completes, fails for good, is skipped or cancelled, so the archive tables' archived_at index
-- answers without reading the tasks table (whose few indexes keep a task's updates cheap).
-- Where one step uses the queue (step mode), or by_step is false, the index alone counts; a
-- flow-mode queue's steps are read from the messages. For the dashboard and metrics; reads only,
-- takes no locks. A queue without an archive table (dropped meanwhile) is left out.
create function pgflow.finished_tasks(since interval default '1 hour', by_step boolean default true)
returns table (queue_name text, step_slug text, minute timestamptz, tasks bigint)
language plpgsql
stable
set search_path = ''
as $$
declare
  v_queue record;
begin
  for v_queue in
    select q.queue_name, min(q.step_slug) as only_step, count(distinct q.step_slug) = 1 as one_step
    from (
      select s.queue_name, s.step_slug from pgflow.steps as s where s.step_type <> 'signal'
      union
      select pgflow.default_queue_name(f.flow_slug), null from pgflow.flows as f
      where f.queue_mode = 'flow'
    ) as q
    group by q.queue_name
    order by q.queue_name
  loop
    continue when to_regclass(format('pgmq.%I', pgflow.pgmq_table_name(v_queue.queue_name, 'a'))) is null;
    if v_queue.one_step or not by_step then
      return query execute format(
        'select $1, $2, date_trunc(''minute'', a.archived_at), count(*)'
        ' from pgmq.%I as a where a.archived_at > now() - $3 group by 3',
        pgflow.pgmq_table_name(v_queue.queue_name, 'a'))
        using v_queue.queue_name, case when by_step then v_queue.only_step end, since;
    else
      return query execute format(
        'select $1, a.message ->> ''step_slug'', date_trunc(''minute'', a.archived_at), count(*)'
        ' from pgmq.%I as a where a.archived_at > now() - $2 group by 2, 3',
        pgflow.pgmq_table_name(v_queue.queue_name, 'a'))
        using v_queue.queue_name, since;
    end if;
  end loop;
end;
$$;

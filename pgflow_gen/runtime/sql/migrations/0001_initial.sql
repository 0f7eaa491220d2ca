-- The pgflow schema holds the whole engine: definitions, runtime state and the functions that move it.
-- Created once by migration 0001; nothing else lives here.
create schema if not exists pgflow;

-- Applied engine migrations with the checksum of the file that was applied.
-- Written only by `pgflow-gen db migrate` (or the SQL that `pgflow-gen db sql` prints).
create table pgflow.schema_migrations (
  version text primary key,
  name text not null,
  checksum text not null,
  applied_at timestamptz not null default now(),
  constraint version_is_numbered check (version ~ '^[0-9]{4}$')
);

-- Slug rule of engine version 1 (pgflow's older rule): 1-128 characters, ASCII letters, digits and
-- `_`, not starting with a digit, not the reserved word `run`. Used by check constraints and writers.
create function pgflow.is_valid_slug(slug text)
returns boolean
language sql
immutable
set search_path = ''
as $$
  select slug is not null
    and length(slug) between 1 and 128
    and slug ~ '^[A-Za-z_][A-Za-z0-9_]*$'
    and slug <> 'run'
$$;

-- Flow definitions: one row per concrete flow slug, with the flow-wide option defaults.
-- Written by create_flow and ensure_flow_compiled under the flow's advisory lock.
create table pgflow.flows (
  flow_slug text primary key,
  opt_max_attempts int not null default 3,
  opt_base_delay int not null default 5,
  opt_timeout int not null default 60,
  created_at timestamptz not null default now(),
  constraint flow_slug_is_valid check (pgflow.is_valid_slug(flow_slug)),
  constraint opt_max_attempts_is_positive check (opt_max_attempts >= 1),
  constraint opt_base_delay_is_nonnegative check (opt_base_delay >= 0),
  constraint opt_timeout_is_positive check (opt_timeout >= 1)
);

-- Step definitions in step_index order (the topological order); queue_name is the step's route.
-- Written by add_step and ensure_flow_compiled under the flow's advisory lock; never updated.
create table pgflow.steps (
  flow_slug text not null references pgflow.flows (flow_slug),
  step_slug text not null,
  step_index int not null,
  step_type text not null default 'single',
  deps_count int not null default 0,
  queue_name text not null,
  opt_max_attempts int,
  opt_base_delay int,
  opt_timeout int,
  opt_start_delay int,
  required_input_pattern jsonb,
  forbidden_input_pattern jsonb,
  when_unmet text not null default 'skip',
  when_exhausted text not null default 'fail',
  created_at timestamptz not null default now(),
  primary key (flow_slug, step_slug),
  constraint steps_step_index_is_unique unique (flow_slug, step_index),
  constraint step_slug_is_valid check (pgflow.is_valid_slug(step_slug)),
  constraint step_index_is_nonnegative check (step_index >= 0),
  constraint step_type_is_known check (step_type in ('single', 'map')),
  constraint deps_count_is_nonnegative check (deps_count >= 0),
  constraint map_step_has_at_most_one_dependency check (step_type <> 'map' or deps_count <= 1),
  constraint queue_name_is_canonical check (
    length(queue_name) between 1 and 47 and queue_name = lower(queue_name)
  ),
  constraint opt_max_attempts_is_positive check (opt_max_attempts is null or opt_max_attempts >= 1),
  constraint opt_base_delay_is_nonnegative check (opt_base_delay is null or opt_base_delay >= 0),
  constraint opt_timeout_is_positive check (opt_timeout is null or opt_timeout >= 1),
  constraint opt_start_delay_is_nonnegative check (opt_start_delay is null or opt_start_delay >= 0),
  constraint required_input_pattern_is_object check (
    required_input_pattern is null or jsonb_typeof(required_input_pattern) = 'object'
  ),
  constraint forbidden_input_pattern_is_object check (
    forbidden_input_pattern is null or jsonb_typeof(forbidden_input_pattern) = 'object'
  ),
  constraint when_unmet_is_known check (when_unmet in ('fail', 'skip', 'skip-cascade')),
  constraint when_exhausted_is_known check (when_exhausted in ('fail', 'skip', 'skip-cascade'))
);

-- Dependency edges: step_slug depends on dep_slug. Acyclic because a dependency must already exist
-- (steps are added in topological order). Written with the step by add_step.
create table pgflow.deps (
  flow_slug text not null,
  dep_slug text not null,
  step_slug text not null,
  created_at timestamptz not null default now(),
  primary key (flow_slug, dep_slug, step_slug),
  foreign key (flow_slug, dep_slug) references pgflow.steps (flow_slug, step_slug),
  foreign key (flow_slug, step_slug) references pgflow.steps (flow_slug, step_slug),
  constraint dep_is_not_self check (dep_slug <> step_slug)
);

create index deps_step_idx on pgflow.deps (flow_slug, step_slug);

-- Worker processes: each polls exactly one queue. Heartbeats keep last_heartbeat_at fresh;
-- an operator sets deprecated_at to make a worker drain and stop.
create table pgflow.workers (
  worker_id uuid primary key,
  queue_name text not null,
  flow_slug text,
  step_slug text,
  function_name text not null,
  started_at timestamptz not null default now(),
  last_heartbeat_at timestamptz not null default now(),
  stopped_at timestamptz,
  deprecated_at timestamptz
);

create index workers_queue_name_idx on pgflow.workers (queue_name);
create index workers_last_heartbeat_at_idx on pgflow.workers (last_heartbeat_at);

-- Status values as domains rather than per-table CHECK constraints: a domain's check is compiled
-- once per session (type cache), while a table's CHECK expressions are rebuilt for every
-- statement that writes the table, and these tables are written on every task transition.
create domain pgflow.run_status as text
  constraint run_status_is_known check (value in ('started', 'completed', 'failed'));

create domain pgflow.step_status as text
  constraint step_status_is_known check (value in ('created', 'started', 'completed', 'failed', 'skipped'));

create domain pgflow.task_status as text
  constraint task_status_is_known check (
    value in ('queued', 'started', 'completed', 'failed', 'skipped', 'cancelled')
  );

create domain pgflow.skip_reason as text
  constraint skip_reason_is_known check (
    value in ('condition_unmet', 'handler_failed', 'dependency_skipped')
  );

-- One row per run of a flow. remaining_steps counts down as steps complete or are skipped.
-- Locked (for update) by every transition of the run, which serialises them per run.
create table pgflow.runs (
  run_id uuid primary key default gen_random_uuid(),
  flow_slug text not null references pgflow.flows (flow_slug),
  status pgflow.run_status not null default 'started',
  input jsonb not null,
  output jsonb,
  remaining_steps int not null default 0,
  started_at timestamptz not null default now(),
  completed_at timestamptz,
  failed_at timestamptz,
  constraint remaining_steps_is_nonnegative check (remaining_steps >= 0)
) with (fillfactor = 80);

create index runs_flow_slug_idx on pgflow.runs (flow_slug);
create index runs_status_idx on pgflow.runs (status);

-- One row per (run, step). remaining_deps counts unfinished dependencies; remaining_tasks counts
-- unfinished tasks once the step started; initial_tasks is null until a dependent map knows its size.
-- No index covers a column that changes, so state transitions are HOT updates.
create table pgflow.step_states (
  run_id uuid not null references pgflow.runs (run_id),
  flow_slug text not null,
  step_slug text not null,
  status pgflow.step_status not null default 'created',
  output jsonb,
  skip_reason pgflow.skip_reason,
  error_message text,
  remaining_tasks int,
  remaining_deps int not null default 0,
  initial_tasks int,
  created_at timestamptz not null default now(),
  started_at timestamptz,
  completed_at timestamptz,
  failed_at timestamptz,
  skipped_at timestamptz,
  primary key (run_id, step_slug),
  foreign key (flow_slug, step_slug) references pgflow.steps (flow_slug, step_slug),
  constraint remaining_deps_is_nonnegative check (remaining_deps >= 0),
  constraint remaining_tasks_is_nonnegative check (remaining_tasks is null or remaining_tasks >= 0),
  constraint output_is_only_on_completed check (output is null or status = 'completed'),
  constraint skip_reason_is_only_on_skipped check ((status = 'skipped') = (skip_reason is not null))
) with (fillfactor = 80);

create index step_states_flow_slug_idx on pgflow.step_states (flow_slug, step_slug);

-- One row per unit of work: one for a single step, one per element for a map step.
-- queue_name is the step's route copied once at creation; (queue_name, message_id) is unique
-- because PGMQ message ids are unique only within one queue. Few indexes on purpose: completing a
-- task should be a HOT update (no indexed column changes).
create table pgflow.step_tasks (
  run_id uuid not null,
  flow_slug text not null,
  step_slug text not null,
  task_index int not null default 0,
  status pgflow.task_status not null default 'queued',
  attempts_count int not null default 0,
  message_id bigint,
  queue_name text not null,
  output jsonb,
  error_message text,
  -- Informational; no foreign key, so pruning workers never rewrites task rows.
  last_worker_id uuid,
  requeued_count int not null default 0,
  last_requeued_at timestamptz,
  permanently_stalled_at timestamptz,
  queued_at timestamptz not null default now(),
  started_at timestamptz,
  completed_at timestamptz,
  failed_at timestamptz,
  primary key (run_id, step_slug, task_index),
  foreign key (run_id, step_slug) references pgflow.step_states (run_id, step_slug),
  constraint output_is_only_on_finished check (output is null or status = 'completed' or status = 'failed')
) with (fillfactor = 80);

-- Unique per queue; message_id leads so that claims (message_id = any (...)) use it directly.
create unique index step_tasks_message_queue_idx on pgflow.step_tasks (message_id, queue_name);

-- Messages of completed tasks, waiting to be archived in batches: complete_task records its
-- message here (a cheap insert) instead of one PGMQ archive call per task. The message normally
-- stays invisible meanwhile (its lease outlives the task; a late re-read claims nothing). Drained
-- by start_tasks for its queue and by requeue_stalled_tasks and prune_data_older_than for all.
create table pgflow.archivable_messages (
  queue_name text not null,
  message_id bigint not null,
  primary key (queue_name, message_id)
);

-- What start_tasks returns for each claimed task: its key, its assembled input and, for root
-- single steps only, the run input (map tasks never duplicate a large input).
create type pgflow.step_task_record as (
  flow_slug text,
  run_id uuid,
  step_slug text,
  input jsonb,
  msg_id bigint,
  task_index int,
  flow_input jsonb
);

-- Serialises every writer of one flow's definition (create_flow, add_step, ensure_flow_compiled,
-- delete_flow_and_data) with a transaction-scoped advisory lock keyed by the lower-cased slug.
create function pgflow._lock_flow_definition(flow_slug text)
returns void
language sql
volatile
set search_path = ''
as $$
  select pg_advisory_xact_lock(1, hashtext(lower(flow_slug)))
$$;

-- Run and step events on the channel pgflow_run_<run id without dashes>. The payload names the
-- transition only, never an output, so it always fits NOTIFY's 8000-byte limit.
-- PL/pgSQL rather than SQL so that its plan is cached (it runs on every transition).
create function pgflow._emit_event(run_id uuid, event text, step_slug text, status text)
returns void
language plpgsql
volatile
set search_path = ''
as $$
begin
  perform pg_notify(
    'pgflow_run_' || replace(run_id::text, '-', ''),
    json_build_object('event', event, 'run_id', run_id, 'step_slug', step_slug, 'status', status)::text
  );
end;
$$;

-- Seconds before a failed task becomes visible again: base_delay * 2^attempts_count, where
-- attempts_count already includes the attempt that just failed. Called by fail_task.
create function pgflow.calculate_retry_delay(base_delay numeric, attempts_count int)
returns int
language sql
immutable
set search_path = ''
as $$
  select least(floor(base_delay * power(2::numeric, attempts_count)), 2147483647)::int
$$;

-- Sets the visibility of several messages of one queue in one statement (PGMQ has no batched
-- set_vt with per-message offsets). Unknown ids are ignored; callers compare the returned rows.
-- Locks the PGMQ rows it updates: callers must already hold the matching step_tasks rows.
create function pgflow.set_vt_batch(queue_name text, msg_ids bigint[], vt_offsets int[])
returns table (msg_id bigint, vt timestamptz)
language plpgsql
volatile
set search_path = ''
as $$
begin
  if msg_ids is null or cardinality(msg_ids) = 0 then
    return;
  end if;
  if cardinality(msg_ids) <> coalesce(cardinality(vt_offsets), 0) then
    raise exception 'set_vt_batch: % message ids but % offsets',
      cardinality(msg_ids), coalesce(cardinality(vt_offsets), 0);
  end if;
  return query execute format(
    $q$
      update pgmq.%I as q
      set vt = clock_timestamp() + make_interval(secs => v.vt_offset)
      from unnest($1, $2) as v (msg_id, vt_offset)
      -- The redundant "= any" lets the planner use the queue's primary key instead of a scan.
      where q.msg_id = v.msg_id and q.msg_id = any ($1)
      returning q.msg_id, q.vt
    $q$,
    'q_' || lower(queue_name)
  ) using msg_ids, vt_offsets;
end;
$$;

-- Archives the given messages of one queue (no-op for an empty list or already archived ids).
-- Callers hold the step_tasks rows of these messages first (lock order: tasks, then PGMQ rows).
create function pgflow._archive_messages(queue_name text, msg_ids bigint[])
returns void
language plpgsql
volatile
set search_path = ''
as $$
begin
  if msg_ids is null or cardinality(msg_ids) = 0 then
    return;
  end if;
  perform pgmq.archive(queue_name, msg_ids);
end;
$$;

-- Creates a started step's tasks: one message per task index in the step's queue, carrying only
-- the task key, then the task rows that remember each message id (paired through RETURNING, never
-- by row order). The queue table name is dynamic, so its statement is planned on every call and
-- kept as simple as possible (a single-task step, the common case, inserts one row).
create function pgflow._enqueue_step_tasks(
  run_id uuid,
  flow_slug text,
  step_slug text,
  queue_name text,
  task_count int,
  delay_seconds int
)
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_queue_table text := 'q_' || queue_name;
  v_message_id bigint;
  v_message_ids bigint[];
  v_task_indexes int[];
begin
  if task_count = 1 then
    execute format('insert into pgmq.%I (vt, message) values ($1, $2) returning msg_id', v_queue_table)
    into v_message_id
    using clock_timestamp() + make_interval(secs => delay_seconds),
      jsonb_build_object('flow_slug', flow_slug, 'run_id', run_id, 'step_slug', step_slug, 'task_index', 0);
    insert into pgflow.step_tasks (run_id, flow_slug, step_slug, task_index, message_id, queue_name)
    values (run_id, flow_slug, step_slug, 0, v_message_id, queue_name);
    return;
  end if;

  execute format(
    $q$
      with sent as (
        insert into pgmq.%I (vt, message)
        select $1, jsonb_build_object('flow_slug', $2, 'run_id', $3, 'step_slug', $4, 'task_index', i)
        from generate_series(0, $5 - 1) as i
        returning msg_id, (message ->> 'task_index')::int as task_index
      )
      select array_agg(msg_id), array_agg(task_index) from sent
    $q$,
    v_queue_table
  )
  into v_message_ids, v_task_indexes
  using clock_timestamp() + make_interval(secs => delay_seconds), flow_slug, run_id, step_slug, task_count;
  insert into pgflow.step_tasks (run_id, flow_slug, step_slug, task_index, message_id, queue_name)
  select _enqueue_step_tasks.run_id, _enqueue_step_tasks.flow_slug, _enqueue_step_tasks.step_slug,
    m.task_index, m.message_id, _enqueue_step_tasks.queue_name
  from unnest(v_task_indexes, v_message_ids) as m (task_index, message_id);
end;
$$;

-- Archives the recorded messages of completed tasks, one pgmq.archive call per queue (one queue,
-- or all when queue_name is null, in queue order). Rows another drainer holds are skipped, so
-- drains never wait on each other; rows of a queue that no longer exists are discarded.
-- Touches no task rows. Called by start_tasks (its queue), requeue_stalled_tasks and pruning.
create function pgflow.archive_completed_messages(queue_name text default null)
returns int
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_queue text;
  v_messages bigint[];
  v_total int := 0;
begin
  if archive_completed_messages.queue_name is null then
    for v_queue in
      select distinct m.queue_name from pgflow.archivable_messages as m order by 1
    loop
      v_total := v_total + pgflow.archive_completed_messages(v_queue);
    end loop;
    return v_total;
  end if;

  with picked as (
    select m.message_id
    from pgflow.archivable_messages as m
    where m.queue_name = archive_completed_messages.queue_name
    order by m.message_id
    for update skip locked
  ),
  drained as (
    delete from pgflow.archivable_messages as m
    using picked
    where m.queue_name = archive_completed_messages.queue_name and m.message_id = picked.message_id
    returning m.message_id
  )
  select array_agg(d.message_id) into v_messages from drained as d;
  if v_messages is null then
    return 0;
  end if;
  if exists (select 1 from pgmq.meta as q where q.queue_name = archive_completed_messages.queue_name) then
    perform pgmq.archive(queue_name, v_messages);
  end if;
  return cardinality(v_messages);
end;
$$;

-- Defines a flow-mode flow and creates its queue lower(flow_slug). Idempotent: an existing flow is
-- returned as it is, and different options for it are an error, never a silent change.
-- Takes the flow's definition lock.
create function pgflow.create_flow(
  flow_slug text,
  max_attempts int default null,
  base_delay int default null,
  timeout int default null
)
returns pgflow.flows
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_flow pgflow.flows;
  v_queue text := lower(flow_slug);
begin
  if not pgflow.is_valid_slug(flow_slug) then
    raise exception 'Invalid flow slug "%".', flow_slug
      using errcode = '22023',
        detail = 'A slug has 1 to 128 characters: ASCII letters, digits and "_", not starting with a digit, and is not "run".',
        hint = 'Rename the flow, for example "myFlow" or "my_flow".';
  end if;
  if length(v_queue) > 47 then
    raise exception 'Flow slug "%" is too long for its queue name.', flow_slug
      using errcode = '22023',
        detail = format('The queue "%s" would have %s characters; PGMQ allows at most 47.', v_queue, length(v_queue)),
        hint = 'Shorten the flow slug.';
  end if;
  if max_attempts < 1 or base_delay < 0 or timeout < 1 then
    raise exception 'Invalid options for flow "%".', flow_slug
      using errcode = '22023',
        detail = format('max_attempts=%s, base_delay=%s, timeout=%s', max_attempts, base_delay, timeout),
        hint = 'max_attempts must be at least 1, base_delay at least 0 and timeout at least 1.';
  end if;

  perform pgflow._lock_flow_definition(flow_slug);

  select * into v_flow from pgflow.flows as f where f.flow_slug = create_flow.flow_slug;
  if found then
    if (max_attempts is not null and max_attempts <> v_flow.opt_max_attempts)
      or (base_delay is not null and base_delay <> v_flow.opt_base_delay)
      or (timeout is not null and timeout <> v_flow.opt_timeout) then
      raise exception 'Flow "%" already exists with different options.', flow_slug
        using errcode = '23505',
          detail = format('existing max_attempts=%s, base_delay=%s, timeout=%s',
            v_flow.opt_max_attempts, v_flow.opt_base_delay, v_flow.opt_timeout),
          hint = 'Change options of an existing flow with UPDATE pgflow.flows, or use a new flow slug.';
    end if;
    return v_flow;
  end if;

  insert into pgflow.flows (flow_slug, opt_max_attempts, opt_base_delay, opt_timeout)
  values (flow_slug, coalesce(max_attempts, 3), coalesce(base_delay, 5), coalesce(timeout, 60))
  returning * into v_flow;

  if not exists (select 1 from pgmq.meta as m where lower(m.queue_name) = v_queue) then
    perform pgmq.create(v_queue);
  end if;
  return v_flow;
end;
$$;

-- Appends a step to a flow-mode flow (its step_index is the next one) with its dependency edges.
-- Idempotent: re-adding an identical step returns it; any difference is an error.
-- Takes the flow's definition lock.
create function pgflow.add_step(
  flow_slug text,
  step_slug text,
  deps_slugs text[] default '{}',
  max_attempts int default null,
  base_delay int default null,
  timeout int default null,
  start_delay int default null,
  step_type text default 'single',
  required_input_pattern jsonb default null,
  forbidden_input_pattern jsonb default null,
  when_unmet text default 'skip',
  when_exhausted text default 'fail'
)
returns pgflow.steps
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_deps text[] := coalesce(deps_slugs, '{}');
  v_step pgflow.steps;
  v_existing_deps text[];
  v_unknown text;
begin
  -- GUARD: validate everything before touching any row.
  if not pgflow.is_valid_slug(step_slug) then
    raise exception 'Invalid step slug "%" in flow "%".', step_slug, flow_slug
      using errcode = '22023',
        detail = 'A slug has 1 to 128 characters: ASCII letters, digits and "_", not starting with a digit, and is not "run".',
        hint = 'Rename the step, for example "fetchUser" or "fetch_user".';
  end if;
  if step_type is null or step_type not in ('single', 'map') then
    raise exception 'Invalid step type "%" for step "%".', step_type, step_slug
      using errcode = '22023', hint = 'Use "single" or "map".';
  end if;
  if when_unmet is null or when_unmet not in ('fail', 'skip', 'skip-cascade') then
    raise exception 'Invalid when_unmet "%" for step "%".', when_unmet, step_slug
      using errcode = '22023', hint = 'Use "skip", "skip-cascade" or "fail".';
  end if;
  if when_exhausted is null or when_exhausted not in ('fail', 'skip', 'skip-cascade') then
    raise exception 'Invalid when_exhausted "%" for step "%".', when_exhausted, step_slug
      using errcode = '22023', hint = 'Use "fail", "skip" or "skip-cascade".';
  end if;
  if jsonb_typeof(required_input_pattern) is distinct from 'object' and required_input_pattern is not null
    or jsonb_typeof(forbidden_input_pattern) is distinct from 'object' and forbidden_input_pattern is not null then
    raise exception 'Condition patterns of step "%" must be JSON objects.', step_slug
      using errcode = '22023',
        hint = 'Write the condition as an object, for example {"classify": {"route": "help"}}.';
  end if;
  if max_attempts < 1 or base_delay < 0 or timeout < 1 or start_delay < 0 then
    raise exception 'Invalid options for step "%".', step_slug
      using errcode = '22023',
        detail = format('max_attempts=%s, base_delay=%s, timeout=%s, start_delay=%s',
          max_attempts, base_delay, timeout, start_delay),
        hint = 'max_attempts must be at least 1, base_delay and start_delay at least 0, timeout at least 1.';
  end if;
  if array_position(v_deps, null) is not null then
    raise exception 'Step "%" lists a NULL dependency.', step_slug
      using errcode = '22023', hint = 'List the slugs of the steps it depends on.';
  end if;
  if step_slug = any (v_deps) then
    raise exception 'Step "%" cannot depend on itself.', step_slug using errcode = '22023';
  end if;
  if cardinality(v_deps) <> (select count(distinct d) from unnest(v_deps) as d) then
    raise exception 'Step "%" lists a dependency twice: %.', step_slug, v_deps using errcode = '22023';
  end if;
  if step_type = 'map' and cardinality(v_deps) > 1 then
    raise exception 'Map step "%" can have at most one dependency, got %.', step_slug, cardinality(v_deps)
      using errcode = '22023',
        hint = 'A map step maps the array output of its one dependency (or the run input when it has none).';
  end if;

  perform pgflow._lock_flow_definition(flow_slug);

  if not exists (select 1 from pgflow.flows as f where f.flow_slug = add_step.flow_slug) then
    raise exception 'Flow "%" does not exist.', flow_slug
      using errcode = 'P0002', hint = 'Create it first with pgflow.create_flow().';
  end if;

  select d into v_unknown
  from unnest(v_deps) as d
  where not exists (
    select 1 from pgflow.steps as s where s.flow_slug = add_step.flow_slug and s.step_slug = d
  )
  limit 1;
  if v_unknown is not null then
    raise exception 'Step "%" depends on unknown step "%" in flow "%".', step_slug, v_unknown, flow_slug
      using errcode = '22023',
        hint = 'Add steps in dependency order: a dependency must be added before the steps that use it.';
  end if;

  -- GUARD: an existing step is returned only when identical; definitions never change silently.
  select * into v_step from pgflow.steps as s
  where s.flow_slug = add_step.flow_slug and s.step_slug = add_step.step_slug;
  if found then
    select coalesce(array_agg(d.dep_slug order by d.dep_slug), '{}') into v_existing_deps
    from pgflow.deps as d where d.flow_slug = add_step.flow_slug and d.step_slug = add_step.step_slug;
    if v_existing_deps is distinct from (select coalesce(array_agg(d order by d), '{}') from unnest(v_deps) as d)
      or v_step.step_type is distinct from step_type
      or v_step.required_input_pattern is distinct from required_input_pattern
      or v_step.forbidden_input_pattern is distinct from forbidden_input_pattern
      or v_step.when_unmet is distinct from when_unmet
      or v_step.when_exhausted is distinct from when_exhausted
      or v_step.opt_max_attempts is distinct from max_attempts
      or v_step.opt_base_delay is distinct from base_delay
      or v_step.opt_timeout is distinct from timeout
      or v_step.opt_start_delay is distinct from start_delay then
      raise exception 'Step "%" of flow "%" already exists with a different definition.', step_slug, flow_slug
        using errcode = '23505',
          hint = 'Flow definitions are immutable: use a new flow slug for a new shape.';
    end if;
    return v_step;
  end if;

  insert into pgflow.steps (
    flow_slug, step_slug, step_index, step_type, deps_count, queue_name,
    opt_max_attempts, opt_base_delay, opt_timeout, opt_start_delay,
    required_input_pattern, forbidden_input_pattern, when_unmet, when_exhausted
  )
  select add_step.flow_slug, add_step.step_slug,
    coalesce((select max(s.step_index) + 1 from pgflow.steps as s where s.flow_slug = add_step.flow_slug), 0),
    add_step.step_type, cardinality(v_deps), lower(add_step.flow_slug),
    max_attempts, base_delay, timeout, start_delay,
    required_input_pattern, forbidden_input_pattern, when_unmet, when_exhausted
  returning * into v_step;

  insert into pgflow.deps (flow_slug, dep_slug, step_slug)
  select add_step.flow_slug, d, add_step.step_slug from unnest(v_deps) as d;

  return v_step;
end;
$$;

-- The structural shape of a persisted flow, in the format workers send to ensure_flow_compiled:
-- {"steps": [{slug, stepType, dependencies (sorted), whenUnmet, whenExhausted,
-- requiredInputPattern, forbiddenInputPattern}]}; options are not part of the shape.
create function pgflow._get_flow_shape(flow_slug text)
returns jsonb
language sql
stable
set search_path = ''
as $$
  select jsonb_build_object('steps', coalesce(jsonb_agg(
    jsonb_build_object(
      'slug', s.step_slug,
      'stepType', s.step_type,
      'dependencies', coalesce((
        select jsonb_agg(d.dep_slug order by d.dep_slug)
        from pgflow.deps as d
        where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug
      ), '[]'::jsonb),
      'whenUnmet', s.when_unmet,
      'whenExhausted', s.when_exhausted,
      'requiredInputPattern', case when s.required_input_pattern is null
        then '{"defined": false}'::jsonb
        else jsonb_build_object('defined', true, 'value', s.required_input_pattern) end,
      'forbiddenInputPattern', case when s.forbidden_input_pattern is null
        then '{"defined": false}'::jsonb
        else jsonb_build_object('defined', true, 'value', s.forbidden_input_pattern) end
    ) order by s.step_index
  ), '[]'::jsonb))
  from pgflow.steps as s
  where s.flow_slug = _get_flow_shape.flow_slug
$$;

-- Human-readable differences between two flow shapes, compared step by step in order
-- (empty when structurally equal). Options are ignored: they are tunable in place.
create function pgflow._compare_flow_shapes(expected jsonb, actual jsonb)
returns text[]
language plpgsql
immutable
set search_path = ''
as $$
declare
  v_expected jsonb := coalesce(expected -> 'steps', '[]'::jsonb);
  v_actual jsonb := coalesce(actual -> 'steps', '[]'::jsonb);
  v_count int := greatest(jsonb_array_length(v_expected), jsonb_array_length(v_actual));
  v_differences text[] := '{}';
  v_e jsonb;
  v_a jsonb;
  v_key text;
begin
  if jsonb_array_length(v_expected) <> jsonb_array_length(v_actual) then
    v_differences := v_differences || format('Step count differs: %s vs %s',
      jsonb_array_length(v_expected), jsonb_array_length(v_actual));
  end if;
  for i in 0 .. v_count - 1 loop
    v_e := v_expected -> i;
    v_a := v_actual -> i;
    if v_e is null then
      v_differences := v_differences || format('Step at index %s: missing in first shape (second has "%s")', i, v_a ->> 'slug');
      continue;
    elsif v_a is null then
      v_differences := v_differences || format('Step at index %s: missing in second shape (first has "%s")', i, v_e ->> 'slug');
      continue;
    end if;
    if v_e -> 'slug' is distinct from v_a -> 'slug' then
      v_differences := v_differences || format('Step at index %s: slug differs "%s" vs "%s"', i, v_e ->> 'slug', v_a ->> 'slug');
    end if;
    if v_e -> 'stepType' is distinct from v_a -> 'stepType' then
      v_differences := v_differences || format('Step at index %s: type differs "%s" vs "%s"', i, v_e ->> 'stepType', v_a ->> 'stepType');
    end if;
    if coalesce(v_e -> 'dependencies', '[]') is distinct from coalesce(v_a -> 'dependencies', '[]') then
      v_differences := v_differences || format('Step at index %s: dependencies differ %s vs %s', i,
        coalesce(v_e -> 'dependencies', '[]'), coalesce(v_a -> 'dependencies', '[]'));
    end if;
    foreach v_key in array array['whenUnmet', 'whenExhausted', 'requiredInputPattern', 'forbiddenInputPattern'] loop
      if v_e -> v_key is distinct from v_a -> v_key then
        v_differences := v_differences || format('Step at index %s: %s differs %s vs %s', i, v_key, v_e -> v_key, v_a -> v_key);
      end if;
    end loop;
  end loop;
  return v_differences;
end;
$$;

-- Writes a complete flow definition from a shape: the flow with shape.options, then every step
-- in array order with its options. Called by ensure_flow_compiled under the definition lock.
create function pgflow._create_flow_from_shape(flow_slug text, shape jsonb)
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_options jsonb := coalesce(shape -> 'options', '{}');
  v_step jsonb;
  v_step_options jsonb;
begin
  perform pgflow.create_flow(
    flow_slug,
    (v_options ->> 'maxAttempts')::int,
    (v_options ->> 'baseDelay')::int,
    (v_options ->> 'timeout')::int
  );
  for v_step in select value from jsonb_array_elements(shape -> 'steps') loop
    v_step_options := coalesce(v_step -> 'options', '{}');
    perform pgflow.add_step(
      flow_slug,
      v_step ->> 'slug',
      array(select jsonb_array_elements_text(coalesce(v_step -> 'dependencies', '[]'))),
      (v_step_options ->> 'maxAttempts')::int,
      (v_step_options ->> 'baseDelay')::int,
      (v_step_options ->> 'timeout')::int,
      (v_step_options ->> 'startDelay')::int,
      coalesce(v_step ->> 'stepType', 'single'),
      case when (v_step #>> '{requiredInputPattern,defined}')::boolean
        then v_step #> '{requiredInputPattern,value}' end,
      case when (v_step #>> '{forbiddenInputPattern,defined}')::boolean
        then v_step #> '{forbiddenInputPattern,value}' end,
      coalesce(v_step ->> 'whenUnmet', 'skip'),
      coalesce(v_step ->> 'whenExhausted', 'fail')
    );
  end loop;
end;
$$;

-- Rejects a malformed shape document with a clear error before anything is compared or written.
-- Called by ensure_flow_compiled.
create function pgflow._validate_flow_shape(shape jsonb)
returns void
language plpgsql
immutable
set search_path = ''
as $$
declare
  v_step jsonb;
  v_index int := 0;
  v_duplicate text;
  v_option record;
begin
  if jsonb_typeof(shape) is distinct from 'object' or jsonb_typeof(shape -> 'steps') is distinct from 'array' then
    raise exception 'Invalid flow shape: expected an object with a "steps" array.'
      using errcode = '22023', detail = left(coalesce(shape::text, 'NULL'), 200);
  end if;
  for v_step in select value from jsonb_array_elements(shape -> 'steps') loop
    if jsonb_typeof(v_step) is distinct from 'object' or jsonb_typeof(v_step -> 'slug') is distinct from 'string' then
      raise exception 'Invalid flow shape: step at index % has no string "slug".', v_index
        using errcode = '22023', detail = left(v_step::text, 200);
    end if;
    if v_step ? 'dependencies' and jsonb_typeof(v_step -> 'dependencies') <> 'array' then
      raise exception 'Invalid flow shape: "dependencies" of step "%" is not an array.', v_step ->> 'slug'
        using errcode = '22023';
    end if;
    v_index := v_index + 1;
  end loop;

  select s.value ->> 'slug' into v_duplicate
  from jsonb_array_elements(shape -> 'steps') as s
  group by s.value ->> 'slug' having count(*) > 1
  limit 1;
  if v_duplicate is not null then
    raise exception 'Invalid flow shape: step "%" appears more than once.', v_duplicate
      using errcode = '22023';
  end if;

  -- Options must be whole numbers (flow options, then each step's).
  for v_option in
    select o.key, o.value from jsonb_each(coalesce(shape -> 'options', '{}')) as o
    union all
    select o.key, o.value
    from jsonb_array_elements(shape -> 'steps') as s, jsonb_each(coalesce(s.value -> 'options', '{}')) as o
  loop
    if jsonb_typeof(v_option.value) <> 'number' or v_option.value::text !~ '^-?[0-9]+$' then
      raise exception 'Invalid flow shape: option "%" must be a whole number, got %.', v_option.key, v_option.value
        using errcode = '22023';
    end if;
  end loop;
end;
$$;

-- The structural part of a shape with defaults filled in and dependencies sorted, so that it
-- compares equal to _get_flow_shape of the same definition. Called by ensure_flow_compiled.
create function pgflow._normalize_flow_shape(shape jsonb)
returns jsonb
language sql
immutable
set search_path = ''
as $$
  select jsonb_build_object('steps', coalesce(jsonb_agg(
    jsonb_build_object(
      'slug', s.value -> 'slug',
      'stepType', coalesce(s.value -> 'stepType', '"single"'),
      'dependencies', coalesce((
        select jsonb_agg(d.value order by d.value)
        from jsonb_array_elements_text(coalesce(s.value -> 'dependencies', '[]')) as d
      ), '[]'::jsonb),
      'whenUnmet', coalesce(s.value -> 'whenUnmet', '"skip"'),
      'whenExhausted', coalesce(s.value -> 'whenExhausted', '"fail"'),
      'requiredInputPattern', case when (s.value #>> '{requiredInputPattern,defined}')::boolean
        then jsonb_build_object('defined', true, 'value', s.value #> '{requiredInputPattern,value}')
        else '{"defined": false}'::jsonb end,
      'forbiddenInputPattern', case when (s.value #>> '{forbiddenInputPattern,defined}')::boolean
        then jsonb_build_object('defined', true, 'value', s.value #> '{forbiddenInputPattern,value}')
        else '{"defined": false}'::jsonb end
    ) order by s.ordinality
  ), '[]'::jsonb))
  from jsonb_array_elements(shape -> 'steps') with ordinality as s
$$;

-- Deletes a flow's definition and all its runtime data (archiving its unfinished tasks' messages),
-- and drops its queues unless another flow still routes to them (version 1 lets "Foo" and "foo"
-- share the queue "foo"). Takes the flow's definition lock, then its runs' row locks; does nothing
-- when the flow does not exist.
create function pgflow.delete_flow_and_data(flow_slug text)
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_queues text[];
  v_queue text;
  v_active_queues text[];
  v_active_messages bigint[];
begin
  perform pgflow._lock_flow_definition(flow_slug);
  if not exists (select 1 from pgflow.flows as f where f.flow_slug = delete_flow_and_data.flow_slug) then
    return;
  end if;

  select array_agg(distinct s.queue_name) into v_queues
  from pgflow.steps as s where s.flow_slug = delete_flow_and_data.flow_slug;
  v_queues := array(select distinct q from unnest(coalesce(v_queues, '{}') || lower(flow_slug)) as q);

  -- Same lock order as the task callbacks: runs first (in key order), then their rows.
  perform 1 from pgflow.runs as r
  where r.flow_slug = delete_flow_and_data.flow_slug
  order by r.run_id
  for update;

  -- Messages of unfinished tasks go too (their task rows locked first, in key order, as claims
  -- do): a queue shared with another flow survives this deletion.
  with active as (
    select t.queue_name, t.message_id from pgflow.step_tasks as t
    where t.flow_slug = delete_flow_and_data.flow_slug and t.status in ('queued', 'started')
    order by t.run_id, t.step_slug, t.task_index
    for update
  )
  select array_agg(a.queue_name), array_agg(a.message_id) into v_active_queues, v_active_messages
  from active as a;
  perform pgflow._archive_task_messages(v_active_queues, v_active_messages);

  foreach v_queue in array v_queues loop
    perform pgflow.archive_completed_messages(v_queue);
  end loop;
  delete from pgflow.step_tasks as t where t.flow_slug = delete_flow_and_data.flow_slug;
  delete from pgflow.step_states as s where s.flow_slug = delete_flow_and_data.flow_slug;
  delete from pgflow.runs as r where r.flow_slug = delete_flow_and_data.flow_slug;
  delete from pgflow.deps as d where d.flow_slug = delete_flow_and_data.flow_slug;
  delete from pgflow.steps as s where s.flow_slug = delete_flow_and_data.flow_slug;
  delete from pgflow.flows as f where f.flow_slug = delete_flow_and_data.flow_slug;

  foreach v_queue in array v_queues loop
    continue when exists (select 1 from pgflow.steps as s where s.queue_name = v_queue)
      or exists (select 1 from pgflow.flows as f where lower(f.flow_slug) = v_queue);
    if exists (select 1 from pgmq.meta as m where m.queue_name = v_queue) then
      perform pgmq.drop_queue(v_queue);
    end if;
    delete from pgflow.archivable_messages as m where m.queue_name = v_queue;
  end loop;
end;
$$;

-- Startup compilation: creates a missing flow from its shape, verifies an existing one, and on a
-- structural difference recompiles only in a local database (pgflow.local = on), else reports a
-- mismatch and changes nothing. Takes the flow's definition lock.
create function pgflow.ensure_flow_compiled(flow_slug text, shape jsonb)
returns jsonb
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_differences text[];
begin
  perform pgflow._validate_flow_shape(shape);
  perform pgflow._lock_flow_definition(flow_slug);

  if not exists (select 1 from pgflow.flows as f where f.flow_slug = ensure_flow_compiled.flow_slug) then
    perform pgflow._create_flow_from_shape(flow_slug, shape);
    return jsonb_build_object('status', 'compiled', 'mismatchKind', null, 'differences', '[]'::jsonb);
  end if;

  v_differences := pgflow._compare_flow_shapes(
    pgflow._normalize_flow_shape(shape), pgflow._get_flow_shape(flow_slug)
  );
  if cardinality(v_differences) = 0 then
    return jsonb_build_object('status', 'verified', 'mismatchKind', null, 'differences', '[]'::jsonb);
  end if;

  if coalesce(current_setting('pgflow.local', true), '') = 'on' then
    perform pgflow.delete_flow_and_data(flow_slug);
    perform pgflow._create_flow_from_shape(flow_slug, shape);
    return jsonb_build_object('status', 'recompiled', 'mismatchKind', 'shape',
      'differences', to_jsonb(v_differences));
  end if;
  return jsonb_build_object('status', 'mismatch', 'mismatchKind', 'shape',
    'differences', to_jsonb(v_differences));
end;
$$;

-- Archives task messages that may live in several queues, one pgmq.archive call per queue.
-- Callers pass the (queue_name, message_id) pairs of step_tasks rows they already updated.
create function pgflow._archive_task_messages(queue_names text[], message_ids bigint[])
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_queue text;
begin
  for v_queue in select distinct q from unnest(queue_names) as q loop
    perform pgflow._archive_messages(v_queue, array(
      select m.message_id
      from unnest(queue_names, message_ids) as m (queue_name, message_id)
      where m.queue_name = v_queue and m.message_id is not null
    ));
  end loop;
end;
$$;

-- Fails a started run: every queued or started task becomes cancelled (rows locked in key order)
-- and then its message is archived, so late callbacks and stale messages change nothing.
-- The caller holds the run row lock.
create function pgflow._fail_run(run_id uuid)
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_queues text[];
  v_messages bigint[];
begin
  update pgflow.runs as r set status = 'failed', failed_at = clock_timestamp()
  where r.run_id = _fail_run.run_id and r.status = 'started';
  if not found then
    return;
  end if;

  with locked as (
    select t.step_slug, t.task_index
    from pgflow.step_tasks as t
    where t.run_id = _fail_run.run_id and t.status in ('queued', 'started')
    order by t.step_slug, t.task_index
    for update
  ),
  cancelled as (
    update pgflow.step_tasks as t set status = 'cancelled'
    from locked
    where t.run_id = _fail_run.run_id and t.step_slug = locked.step_slug
      and t.task_index = locked.task_index and t.status in ('queued', 'started')
    returning t.queue_name, t.message_id
  )
  select array_agg(c.queue_name), array_agg(c.message_id) into v_queues, v_messages from cancelled as c;
  perform pgflow._archive_task_messages(v_queues, v_messages);

  perform pgflow._emit_event(run_id, 'run:failed', null, 'failed');
end;
$$;

-- Marks a created or started step completed with its output, counts it off the run, and tells each
-- waiting child that one dependency finished (a dependent map, whose initial_tasks is still null,
-- learns its task count from the array length). Returns true when the run may move on: a child
-- became ready or no step remains. Caller holds the run row lock.
-- Called by complete_task (last task) and _advance_run (steps without tasks).
create function pgflow._complete_step(run_id uuid, step_slug text, output jsonb)
returns boolean
language plpgsql
volatile
set search_path = ''
as $$
declare
  -- Computed here, not inline: the planner folds functions of parameters even in CASE branches.
  v_array_length int := case when jsonb_typeof(output) = 'array' then jsonb_array_length(output) end;
  v_flow_slug text;
  v_ready_children int;
  v_remaining_steps int;
begin
  update pgflow.step_states as ss
  set status = 'completed', output = _complete_step.output, remaining_tasks = 0,
    started_at = coalesce(ss.started_at, clock_timestamp()), completed_at = clock_timestamp()
  where ss.run_id = _complete_step.run_id and ss.step_slug = _complete_step.step_slug
    and ss.status in ('created', 'started')
  returning ss.flow_slug into v_flow_slug;
  if not found then
    return false;
  end if;
  perform pgflow._emit_event(run_id, 'step:completed', step_slug, 'completed');

  -- The children's slugs come from an array subquery, so the update uses the (run_id, step_slug) key.
  with children as (
    update pgflow.step_states as ss
    set remaining_deps = ss.remaining_deps - 1, initial_tasks = coalesce(ss.initial_tasks, v_array_length)
    where ss.run_id = _complete_step.run_id and ss.status = 'created'
      and ss.step_slug = any (array(
        select d.step_slug from pgflow.deps as d
        where d.flow_slug = v_flow_slug and d.dep_slug = _complete_step.step_slug
      ))
    returning ss.remaining_deps
  )
  select count(*) filter (where c.remaining_deps = 0) into v_ready_children from children as c;

  update pgflow.runs as r set remaining_steps = r.remaining_steps - 1
  where r.run_id = _complete_step.run_id
  returning r.remaining_steps into v_remaining_steps;
  return v_ready_children > 0 or v_remaining_steps = 0;
end;
$$;

-- Skips one step (when_unmet or when_exhausted = skip): its unfinished tasks become skipped (rows
-- locked in key order) and then their messages are archived; children lose one dependency, and a
-- map child of it becomes empty. Returns false when the step was no longer open.
-- Caller holds the run row lock.
create function pgflow._skip_step(run_id uuid, step_slug text, skip_reason text, error_message text)
returns boolean
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_queues text[];
  v_messages bigint[];
  v_flow_slug text;
begin
  update pgflow.step_states as ss
  set status = 'skipped', skip_reason = _skip_step.skip_reason, error_message = _skip_step.error_message,
    remaining_tasks = null, skipped_at = clock_timestamp()
  where ss.run_id = _skip_step.run_id and ss.step_slug = _skip_step.step_slug
    and ss.status in ('created', 'started')
  returning ss.flow_slug into v_flow_slug;
  if not found then
    return false;
  end if;

  with locked as (
    select t.task_index
    from pgflow.step_tasks as t
    where t.run_id = _skip_step.run_id and t.step_slug = _skip_step.step_slug
      and t.status in ('queued', 'started')
    order by t.task_index
    for update
  ),
  skipped as (
    update pgflow.step_tasks as t set status = 'skipped'
    from locked
    where t.run_id = _skip_step.run_id and t.step_slug = _skip_step.step_slug
      and t.task_index = locked.task_index and t.status in ('queued', 'started')
    returning t.queue_name, t.message_id
  )
  select array_agg(s.queue_name), array_agg(s.message_id) into v_queues, v_messages from skipped as s;
  perform pgflow._archive_task_messages(v_queues, v_messages);
  perform pgflow._emit_event(run_id, 'step:skipped', step_slug, 'skipped');

  -- The children's slugs come from an array subquery, so the update uses the (run_id, step_slug) key;
  -- a map child of a skipped step has nothing to map.
  update pgflow.step_states as ss
  set remaining_deps = ss.remaining_deps - 1,
    initial_tasks = coalesce(ss.initial_tasks, 0)
  where ss.run_id = _skip_step.run_id and ss.status = 'created'
    and ss.step_slug = any (array(
      select d.step_slug from pgflow.deps as d
      where d.flow_slug = v_flow_slug and d.dep_slug = _skip_step.step_slug
    ));

  update pgflow.runs as r set remaining_steps = r.remaining_steps - 1
  where r.run_id = _skip_step.run_id;
  return true;
end;
$$;

-- Skips a step and every step downstream of it (skip-cascade): the step gets skip_reason, its
-- descendants dependency_skipped; their unfinished tasks become skipped (rows locked in key order),
-- then their messages are archived.
-- Returns how many steps it skipped (0 when already done). Caller holds the run lock.
create function pgflow._skip_step_cascade(run_id uuid, step_slug text, skip_reason text, error_message text)
returns int
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_skipped text[];
  v_queues text[];
  v_messages bigint[];
  v_slug text;
begin
  with recursive downstream (step_slug) as (
    select _skip_step_cascade.step_slug
    union
    select d.step_slug
    from downstream
    join pgflow.runs as r on r.run_id = _skip_step_cascade.run_id
    join pgflow.deps as d on d.flow_slug = r.flow_slug and d.dep_slug = downstream.step_slug
  ),
  skipped as (
    update pgflow.step_states as ss
    set status = 'skipped',
      skip_reason = case when ss.step_slug = _skip_step_cascade.step_slug
        then _skip_step_cascade.skip_reason else 'dependency_skipped' end,
      error_message = case when ss.step_slug = _skip_step_cascade.step_slug
        then _skip_step_cascade.error_message end,
      remaining_tasks = null,
      skipped_at = clock_timestamp()
    from downstream
    where ss.run_id = _skip_step_cascade.run_id and ss.step_slug = downstream.step_slug
      and ss.status in ('created', 'started')
    returning ss.step_slug
  )
  select array_agg(s.step_slug) into v_skipped from skipped as s;
  if v_skipped is null then
    return 0;
  end if;

  with locked as (
    select t.step_slug, t.task_index
    from pgflow.step_tasks as t
    where t.run_id = _skip_step_cascade.run_id and t.step_slug = any (v_skipped)
      and t.status in ('queued', 'started')
    order by t.step_slug, t.task_index
    for update
  ),
  skipped_tasks as (
    update pgflow.step_tasks as t set status = 'skipped'
    from locked
    where t.run_id = _skip_step_cascade.run_id and t.step_slug = locked.step_slug
      and t.task_index = locked.task_index and t.status in ('queued', 'started')
    returning t.queue_name, t.message_id
  )
  select array_agg(s.queue_name), array_agg(s.message_id) into v_queues, v_messages from skipped_tasks as s;
  perform pgflow._archive_task_messages(v_queues, v_messages);

  for v_slug in
    select ss.step_slug from pgflow.step_states as ss
    join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    where ss.run_id = _skip_step_cascade.run_id and ss.step_slug = any (v_skipped)
    order by s.step_index
  loop
    perform pgflow._emit_event(run_id, 'step:skipped', v_slug, 'skipped');
  end loop;

  update pgflow.runs as r set remaining_steps = r.remaining_steps - cardinality(v_skipped)
  where r.run_id = _skip_step_cascade.run_id;
  return cardinality(v_skipped);
end;
$$;

-- Moves every ready step of a run (created, no remaining dependencies) forward, in step order:
-- evaluates its condition once, then skips it, fails the run, completes it at once when it has no
-- tasks, or starts it (tasks + one message each). Skips and instant completions can ready more
-- steps, so it repeats until a pass changes nothing but starts. A run that started nothing may be
-- finished, so then it tries to complete it.
-- Returns false when the run failed. Caller holds the run row lock.
create function pgflow._advance_run(run_id uuid)
returns boolean
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_step record;
  v_target jsonb;
  v_again boolean := true;
  v_started boolean := false;
begin
  while v_again loop
    v_again := false;
    for v_step in
      select ss.step_slug, ss.flow_slug, ss.initial_tasks, s.step_type, s.deps_count, s.queue_name,
        s.opt_start_delay, s.required_input_pattern, s.forbidden_input_pattern, s.when_unmet, r.input
      from pgflow.step_states as ss
      join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
      join pgflow.runs as r on r.run_id = ss.run_id
      where ss.run_id = _advance_run.run_id and ss.status = 'created' and ss.remaining_deps = 0
      order by s.step_index
    loop
      -- GUARD: conditions are evaluated once, now that the step is ready.
      if v_step.required_input_pattern is not null or v_step.forbidden_input_pattern is not null then
        if v_step.deps_count = 0 then
          v_target := v_step.input;
        else
          select coalesce(jsonb_object_agg(d.dep_slug, dep.output), '{}') into v_target
          from pgflow.deps as d
          join pgflow.step_states as dep on dep.run_id = _advance_run.run_id and dep.step_slug = d.dep_slug
          where d.flow_slug = v_step.flow_slug and d.step_slug = v_step.step_slug
            and dep.status = 'completed';
        end if;
        if not ((v_step.required_input_pattern is null or v_target @> v_step.required_input_pattern)
          and (v_step.forbidden_input_pattern is null or not v_target @> v_step.forbidden_input_pattern)) then
          if v_step.when_unmet = 'fail' then
            update pgflow.step_states as ss
            set status = 'failed', error_message = 'Condition not met', failed_at = clock_timestamp()
            where ss.run_id = _advance_run.run_id and ss.step_slug = v_step.step_slug
              and ss.status = 'created';
            continue when not found;
            perform pgflow._emit_event(run_id, 'step:failed', v_step.step_slug, 'failed');
            perform pgflow._fail_run(run_id);
            return false;
          elsif v_step.when_unmet = 'skip' then
            v_again := pgflow._skip_step(run_id, v_step.step_slug, 'condition_unmet', null) or v_again;
          else
            v_again := pgflow._skip_step_cascade(run_id, v_step.step_slug, 'condition_unmet', null) > 0
              or v_again;
          end if;
          continue;
        end if;
      end if;

      if v_step.initial_tasks is null then
        raise exception 'Step "%" of run % is ready but its task count is unknown.', v_step.step_slug, run_id
          using hint = 'This is an engine bug: a dependent map learns its size when its dependency completes.';
      end if;
      if v_step.initial_tasks = 0 then
        perform pgflow._complete_step(run_id, v_step.step_slug,
          case when v_step.step_type = 'map' then '[]'::jsonb end);
        v_again := true;
        continue;
      end if;

      -- GUARD: a skip-cascade earlier in this pass may have closed the step already.
      update pgflow.step_states as ss
      set status = 'started', started_at = clock_timestamp(), remaining_tasks = ss.initial_tasks
      where ss.run_id = _advance_run.run_id and ss.step_slug = v_step.step_slug and ss.status = 'created';
      continue when not found;
      perform pgflow._enqueue_step_tasks(run_id, v_step.flow_slug, v_step.step_slug, v_step.queue_name,
        v_step.initial_tasks, coalesce(v_step.opt_start_delay, 0));
      perform pgflow._emit_event(run_id, 'step:started', v_step.step_slug, 'started');
      v_started := true;
    end loop;
  end loop;

  if not v_started then
    perform pgflow._maybe_complete_run(run_id);
  end if;
  return true;
end;
$$;

-- Completes a started run once no step remains; its output maps each completed leaf step (one
-- that nothing depends on) to its output, and is null when every leaf was skipped.
-- Caller holds the run row lock.
create function pgflow._maybe_complete_run(run_id uuid)
returns void
language plpgsql
volatile
set search_path = ''
as $$
begin
  update pgflow.runs as r
  set status = 'completed', completed_at = clock_timestamp(), output = (
    select jsonb_object_agg(ss.step_slug, ss.output)
    from pgflow.step_states as ss
    where ss.run_id = r.run_id and ss.status = 'completed'
      and not exists (
        select 1 from pgflow.deps as d where d.flow_slug = ss.flow_slug and d.dep_slug = ss.step_slug
      )
  )
  where r.run_id = _maybe_complete_run.run_id and r.status = 'started' and r.remaining_steps = 0;
  if found then
    perform pgflow._emit_event(run_id, 'run:completed', null, 'completed');
  end if;
end;
$$;

-- Starts a run: one step state per step, then every ready step moves forward at once (conditions,
-- empty maps, first messages). A flow with a root map needs an array input. Returns the run.
-- Holds the flow's definition lock shared, so the definition cannot change while it is read.
create function pgflow.start_flow(flow_slug text, input jsonb, run_id uuid default null)
returns setof pgflow.runs
language plpgsql
volatile
set search_path = ''
as $$
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

  insert into pgflow.runs (run_id, flow_slug, input, remaining_steps)
  values (v_run_id, flow_slug, input,
    (select count(*) from pgflow.steps as s where s.flow_slug = start_flow.flow_slug));

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

-- Phase two of a claim: of the messages a worker read from queue_name, claims the queued tasks of
-- this flow whose run and step are started, extends each message's visibility to the step's
-- timeout + 2 s, and returns the tasks with their inputs. Task rows locked by someone else are
-- skipped (their message comes back later), so a claim never waits; then PGMQ rows are locked.
-- First it archives the queue's batch of completed tasks' messages.
create function pgflow.start_tasks(flow_slug text, msg_ids bigint[], worker_id uuid, queue_name text)
returns setof pgflow.step_task_record
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_queue text := lower(queue_name);
  v_run_ids uuid[];
  v_step_slugs text[];
  v_task_indexes int[];
  v_message_ids bigint[];
  v_offsets int[];
  v_visible_set int;
begin
  if queue_name is null then
    raise exception 'start_tasks needs the queue the messages were read from.' using errcode = '22004';
  end if;
  if msg_ids is null or cardinality(msg_ids) = 0 then
    return;
  end if;
  if not exists (select 1 from pgflow.workers as w where w.worker_id = start_tasks.worker_id) then
    raise exception 'Worker % is not registered.', worker_id
      using errcode = 'P0002', hint = 'Register it with pgflow.register_worker() before claiming.';
  end if;
  perform pgflow.archive_completed_messages(v_queue);

  -- GUARD: only queued tasks are claimed (a queued task always belongs to a started run and step:
  -- failing a run cancels its tasks, skipping a step skips them); the task row lock decides races.
  with candidates as (
    select t.run_id, t.step_slug, t.task_index
    from pgflow.step_tasks as t
    where t.queue_name = v_queue and t.message_id = any (start_tasks.msg_ids)
      and t.flow_slug = start_tasks.flow_slug and t.status = 'queued'
    order by t.run_id, t.step_slug, t.task_index
    for update skip locked
  ),
  claimed as (
    update pgflow.step_tasks as t
    set status = 'started', attempts_count = t.attempts_count + 1,
      started_at = clock_timestamp(), last_worker_id = start_tasks.worker_id
    from candidates as c, pgflow.steps as s, pgflow.flows as f
    where t.run_id = c.run_id and t.step_slug = c.step_slug and t.task_index = c.task_index
      and s.flow_slug = t.flow_slug and s.step_slug = t.step_slug and f.flow_slug = t.flow_slug
    returning t.run_id, t.step_slug, t.task_index, t.message_id,
      coalesce(s.opt_timeout, f.opt_timeout) + 2 as vt_offset
  )
  select array_agg(c.run_id), array_agg(c.step_slug), array_agg(c.task_index),
    array_agg(c.message_id), array_agg(c.vt_offset)
  into v_run_ids, v_step_slugs, v_task_indexes, v_message_ids, v_offsets
  from claimed as c;
  if v_message_ids is null then
    return;
  end if;

  -- GUARD: the lease must be in place before any task is returned, or the claim is undone.
  select count(*) into v_visible_set from pgflow.set_vt_batch(v_queue, v_message_ids, v_offsets);
  if v_visible_set <> cardinality(v_message_ids) then
    raise exception 'start_tasks: % of % claimed messages are missing from queue "%".',
      cardinality(v_message_ids) - v_visible_set, cardinality(v_message_ids), v_queue
      using hint = 'Messages of pgflow queues must only be archived or deleted by pgflow.';
  end if;

  return query
  select start_tasks.flow_slug, c.run_id, c.step_slug,
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
    case when s.step_type = 'single' and s.deps_count = 0 then r.input end
  from unnest(v_run_ids, v_step_slugs, v_task_indexes, v_message_ids)
    as c (run_id, step_slug, task_index, message_id)
  join pgflow.runs as r on r.run_id = c.run_id
  join pgflow.steps as s on s.flow_slug = start_tasks.flow_slug and s.step_slug = c.step_slug
  order by c.message_id;
end;
$$;

-- A worker reports a task's output. The last task of a step completes the step (a map's output
-- is its task outputs in task order), which readies children and may complete the run.
-- Late callbacks (run finished, step closed, task not started) change nothing.
-- Locks run, step state and task (in that order, in one statement); its message is archived in a
-- later batch (pgflow.archivable_messages), so this hot path never waits for a PGMQ row.
create function pgflow.complete_task(run_id uuid, step_slug text, task_index int, output jsonb)
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

  -- The message is archived later, in a batch (see pgflow.archivable_messages).
  insert into pgflow.archivable_messages (queue_name, message_id)
  values (v_task.queue_name, v_task.message_id)
  on conflict do nothing;
  return next v_task;
end;
$$;

-- A worker reports a task's failure. With attempts left the task is queued again and its message
-- hidden for base_delay * 2^attempts seconds; exhausted (or parked by stall recovery),
-- when_exhausted decides: fail the run, skip the step, or skip it and everything downstream.
-- Locks run, step state and task (in that order, in one statement), then PGMQ rows.
create function pgflow.fail_task(run_id uuid, step_slug text, task_index int, error_message text)
returns setof pgflow.step_tasks
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_locked record;
  v_step record;
  v_task pgflow.step_tasks;
  v_delayed int;
begin
  select r.status as run_status, t as task into v_locked
  from pgflow.runs as r
  join pgflow.step_states as ss on ss.run_id = r.run_id and ss.step_slug = fail_task.step_slug
  join pgflow.step_tasks as t
    on t.run_id = r.run_id and t.step_slug = ss.step_slug and t.task_index = fail_task.task_index
  where r.run_id = fail_task.run_id
  for update of r, ss, t;
  if not found then
    if not exists (select 1 from pgflow.runs as r where r.run_id = fail_task.run_id) then
      raise exception 'Run % does not exist.', run_id using errcode = 'P0002';
    end if;
    raise exception 'Task % of step "%" in run % does not exist.', task_index, step_slug, run_id
      using errcode = 'P0002';
  end if;
  v_task := v_locked.task;
  select ss.status, s.when_exhausted,
    coalesce(s.opt_max_attempts, f.opt_max_attempts) as max_attempts,
    coalesce(s.opt_base_delay, f.opt_base_delay) as base_delay
  into v_step
  from pgflow.step_states as ss
  join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
  join pgflow.flows as f on f.flow_slug = ss.flow_slug
  where ss.run_id = fail_task.run_id and ss.step_slug = fail_task.step_slug;

  -- GUARD: late callbacks are no-ops (cancellation and skips win).
  if v_locked.run_status <> 'started' or v_task.status <> 'started' or v_step.status <> 'started' then
    return next v_task;
    return;
  end if;

  -- A parked task's message is gone: it cannot be retried, so its failure is final. So is the
  -- failure of a task whose message someone removed (nothing could deliver the retry).
  if v_task.attempts_count < v_step.max_attempts and v_task.permanently_stalled_at is null then
    select count(*) into v_delayed from pgflow.set_vt_batch(v_task.queue_name, array[v_task.message_id],
      array[pgflow.calculate_retry_delay(v_step.base_delay, v_task.attempts_count)]);
    if v_delayed = 1 then
      update pgflow.step_tasks as t
      set status = 'queued', started_at = null, error_message = fail_task.error_message
      where t.run_id = fail_task.run_id and t.step_slug = fail_task.step_slug and t.task_index = fail_task.task_index
      returning * into v_task;
      return next v_task;
      return;
    end if;
  end if;

  update pgflow.step_tasks as t
  set status = 'failed', failed_at = clock_timestamp(), error_message = fail_task.error_message
  where t.run_id = fail_task.run_id and t.step_slug = fail_task.step_slug and t.task_index = fail_task.task_index
  returning * into v_task;

  if v_step.when_exhausted = 'fail' then
    update pgflow.step_states as ss
    set status = 'failed', failed_at = clock_timestamp(), remaining_tasks = null,
      error_message = fail_task.error_message
    where ss.run_id = fail_task.run_id and ss.step_slug = fail_task.step_slug;
    perform pgflow._emit_event(run_id, 'step:failed', step_slug, 'failed');
    perform pgflow._fail_run(run_id);
  else
    if v_step.when_exhausted = 'skip' then
      perform pgflow._skip_step(run_id, step_slug, 'handler_failed', error_message);
    else
      perform pgflow._skip_step_cascade(run_id, step_slug, 'handler_failed', error_message);
    end if;
    perform pgflow._advance_run(run_id);
  end if;

  -- Last: PGMQ rows are only touched after every task row this call needs is locked.
  perform pgmq.archive(v_task.queue_name, v_task.message_id);
  return next v_task;
end;
$$;

-- Recovers tasks whose worker vanished: a task started longer ago than its effective timeout + 30 s
-- (in a started run and step) is queued again and its message made visible, at most 3 times;
-- after that it is parked (permanently_stalled_at) and its message archived. Skips locked tasks.
-- Also archives the completed tasks' messages still waiting in pgflow.archivable_messages.
create function pgflow.requeue_stalled_tasks()
returns int
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_requeue_queues text[];
  v_requeue_messages bigint[];
  v_park_queues text[];
  v_park_messages bigint[];
  v_queue text;
  v_ids bigint[];
begin
  -- Periodic maintenance is also where idle queues get their completed messages archived; first,
  -- before any task row is locked (the drain takes no task locks, so no order to invert).
  perform pgflow.archive_completed_messages();

  with stalled as (
    select t.run_id, t.step_slug, t.task_index
    from pgflow.step_tasks as t
    join pgflow.runs as r on r.run_id = t.run_id and r.status = 'started'
    join pgflow.step_states as ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug and ss.status = 'started'
    join pgflow.steps as s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug
    join pgflow.flows as f on f.flow_slug = t.flow_slug
    where t.status = 'started' and t.permanently_stalled_at is null
      and t.started_at < clock_timestamp() - make_interval(secs => coalesce(s.opt_timeout, f.opt_timeout) + 30)
    for update of t skip locked
  ),
  changed as (
    update pgflow.step_tasks as t
    set status = case when t.requeued_count < 3 then 'queued' else t.status end,
      started_at = case when t.requeued_count < 3 then null else t.started_at end,
      last_worker_id = case when t.requeued_count < 3 then null else t.last_worker_id end,
      requeued_count = case when t.requeued_count < 3 then t.requeued_count + 1 else t.requeued_count end,
      last_requeued_at = case when t.requeued_count < 3 then clock_timestamp() else t.last_requeued_at end,
      permanently_stalled_at = case when t.requeued_count < 3 then null else clock_timestamp() end
    from stalled
    where t.run_id = stalled.run_id and t.step_slug = stalled.step_slug and t.task_index = stalled.task_index
    returning t.queue_name, t.message_id, t.status = 'queued' as requeued
  )
  select array_agg(c.queue_name) filter (where c.requeued), array_agg(c.message_id) filter (where c.requeued),
    array_agg(c.queue_name) filter (where not c.requeued), array_agg(c.message_id) filter (where not c.requeued)
  into v_requeue_queues, v_requeue_messages, v_park_queues, v_park_messages
  from changed as c;

  -- Requeued tasks become visible at once; parked ones leave the queue.
  for v_queue in select distinct q from unnest(v_requeue_queues) as q loop
    v_ids := array(select x.m from unnest(v_requeue_queues, v_requeue_messages) as x (q, m) where x.q = v_queue);
    perform pgflow.set_vt_batch(v_queue, v_ids, array_fill(0, array[cardinality(v_ids)]));
  end loop;
  perform pgflow._archive_task_messages(v_park_queues, v_park_messages);
  return coalesce(cardinality(v_requeue_messages), 0);
end;
$$;

-- Maintenance: deletes finished runs (completed or failed before now - retention) with their step
-- states and tasks, workers silent for longer than retention, and archived messages older than
-- retention in every queue a flow routes to. Running runs are never touched, whatever their age.
create function pgflow.prune_data_older_than(retention interval)
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
    order by r.run_id
    for update skip locked
  );
  if cardinality(v_runs) = 0 then
    v_runs := null;
  end if;

  if v_runs is not null then
    delete from pgflow.step_tasks as t where t.run_id = any (v_runs);
    delete from pgflow.step_states as ss where ss.run_id = any (v_runs);
    delete from pgflow.runs as r where r.run_id = any (v_runs);
  end if;

  delete from pgflow.workers as w where w.last_heartbeat_at < v_cutoff;
  get diagnostics v_workers = row_count;

  for v_queue in
    select distinct s.queue_name from pgflow.steps as s
    union
    select lower(f.flow_slug) from pgflow.flows as f
  loop
    continue when not exists (select 1 from pgmq.meta as m where m.queue_name = v_queue);
    execute format('delete from pgmq.%I where archived_at < $1', 'a_' || v_queue) using v_cutoff;
    get diagnostics v_count = row_count;
    v_archived := v_archived + v_count;
  end loop;

  return jsonb_build_object(
    'runs', coalesce(cardinality(v_runs), 0), 'workers', v_workers, 'archived_messages', v_archived
  );
end;
$$;

-- A worker process announces itself and the one queue it polls (and, for a step worker, its flow
-- and step). Re-registering the same worker id refreshes it. Called once at worker startup.
create function pgflow.register_worker(
  worker_id uuid,
  queue_name text,
  function_name text,
  flow_slug text default null,
  step_slug text default null
)
returns pgflow.workers
language sql
volatile
set search_path = ''
as $$
  insert into pgflow.workers as w (worker_id, queue_name, function_name, flow_slug, step_slug)
  values (worker_id, queue_name, function_name, flow_slug, step_slug)
  on conflict (worker_id) do update
  set queue_name = excluded.queue_name, function_name = excluded.function_name,
    flow_slug = excluded.flow_slug, step_slug = excluded.step_slug,
    last_heartbeat_at = clock_timestamp(), stopped_at = null
  returning w.*
$$;

-- Refreshes a worker's heartbeat and tells it whether an operator deprecated it (then it stops
-- polling and drains). Raises for an unknown worker id. Called every few seconds by each worker.
create function pgflow.heartbeat_worker(worker_id uuid)
returns boolean
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_deprecated boolean;
begin
  update pgflow.workers as w set last_heartbeat_at = clock_timestamp()
  where w.worker_id = heartbeat_worker.worker_id
  returning w.deprecated_at is not null into v_deprecated;
  if not found then
    raise exception 'Worker % is not registered.', worker_id
      using errcode = 'P0002', hint = 'Register it with pgflow.register_worker() first.';
  end if;
  return v_deprecated;
end;
$$;

-- Records that a worker stopped (after draining). Idempotent. Called at worker shutdown.
create function pgflow.mark_worker_stopped(worker_id uuid)
returns void
language sql
volatile
set search_path = ''
as $$
  update pgflow.workers as w set stopped_at = coalesce(w.stopped_at, clock_timestamp())
  where w.worker_id = mark_worker_stopped.worker_id
$$;


-- Engine migration 0019: least privilege.
--
-- No engine function runs for PUBLIC any more. The functions a role may call run as the engine's
-- owner (security definer, search_path = '') and check their caller; `pgflow-gen db roles` creates
-- the group roles (pgflow_admin, pgflow_worker, pgflow_client, pgflow_reader by default) and grants
-- each its functions, recording the names in pgflow.engine_roles. A login role listed in
-- pgflow.step_roles (`db roles --per-step FLOW`) claims, reports on and reads only its own step's
-- tasks (pgflow._require_step_route and its callers). Workers read no table: the run input, trace
-- contexts and schedules come from functions (run_input, run_trace_contexts, list_schedules), and a
-- worker that may not compile verifies its flow (verify_flow_compiled). set_vt_batch and
-- enable_insert_notifications take only the engine's queues. The commit-time settlement of
-- concurrency keys runs as the owner too, and no longer trusts a setting the session could clear.
-- A deployment without roles (the owner or a superuser everywhere) works as before.

-- Per-step credentials (engine 0019): a login role listed here may claim, report on and read only
-- the tasks of its step route (a step of a step-queued flow); the engine checks the session's login
-- role (session_user) in pgflow._require_step_route and its callers. Roles not listed (members of
-- the group roles, the owner, superusers) are not restricted. Written by `pgflow-gen db roles
-- --per-step FLOW --apply`; a row goes with its step.
create table pgflow.step_roles (
  role_name text primary key,
  flow_slug text not null,
  step_slug text not null,
  foreign key (flow_slug, step_slug) references pgflow.steps (flow_slug, step_slug) on delete cascade
);

create index step_roles_flow_slug_step_slug_idx on pgflow.step_roles (flow_slug, step_slug);

-- The group roles `pgflow-gen db roles --apply` granted the engine's functions to (engine 0019),
-- one per kind, so that `pgflow-gen db migrate` grants what later migrations add to the same
-- roles. Empty in a deployment that uses no roles (the owner or a superuser does everything).
create table pgflow.engine_roles (
  kind text primary key,
  role_name text not null,
  granted_at timestamptz not null default now(),
  constraint kind_is_known check (kind in ('admin', 'worker', 'client', 'reader'))
);

-- Sets the visibility of several messages of one queue in one statement (PGMQ has no batched
-- set_vt with per-message offsets). Unknown ids are ignored; callers compare the returned rows.
-- Locks the PGMQ rows it updates: callers must already hold the matching step_tasks rows. The
-- engine's own callers use it; sessions call pgflow.set_vt_batch, which checks the queue first.
create function pgflow._set_vt_batch(queue_name text, msg_ids bigint[], vt_offsets int[])
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
    pgflow.pgmq_table_name(queue_name)
  ) using msg_ids, vt_offsets;
end;
$$;

-- Whether this session's login role (session_user, which security definer functions and SET ROLE
-- leave as it is) is a step role of pgflow.step_roles (engine 0019): one index probe. The one
-- statement of the rule, for pgflow._require_step_route and the other checks. No writes.
create function pgflow._session_is_step_role()
returns boolean
language sql
stable
set search_path = ''
as $$
  select exists (select 1 from pgflow.step_roles as r where r.role_name = session_user)
$$;

-- Refuses (SQLSTATE 42501) a session whose login role is a step role (pgflow.step_roles) when the
-- step route it works on is not its own; a null step (a flow-mode claim) is no step role's route.
-- Other sessions pass after one index probe. Called by the claims (pgflow._claim_route),
-- register_worker and the other pgflow._require_* checks. No writes, no locks.
create function pgflow._require_step_route(flow_slug text, step_slug text)
returns void
language plpgsql
stable
set search_path = ''
as $$
declare
  v_routes text;
begin
  if not pgflow._session_is_step_role() then
    return;
  end if;
  if exists (
    select 1 from pgflow.step_roles as r
    where r.role_name = session_user and r.flow_slug = _require_step_route.flow_slug
      and r.step_slug = _require_step_route.step_slug
  ) then
    return;
  end if;
  select string_agg(format('step "%s" of flow "%s"', r.step_slug, r.flow_slug), ', ' order by r.flow_slug, r.step_slug)
  into v_routes from pgflow.step_roles as r where r.role_name = session_user;
  raise exception 'Role "%" may not work on step "%" of flow "%".', session_user, coalesce(step_slug, '(any)'), flow_slug
    using errcode = '42501', detail = format('It is the role of %s only.', v_routes),
      hint = 'Run each step''s worker with that step''s own role (pgflow-gen db roles --per-step).';
end;
$$;

-- Refuses (SQLSTATE 42501) a step role's session that reports on, renews or reads a task of another
-- step (pgflow._require_step_route on the first such task; an unknown run counts as another step's).
-- Other sessions pass after one index probe. Called by complete_task, fail_task, complete_tasks,
-- renew_task_leases. No writes, no locks.
create function pgflow._require_task_routes(run_ids uuid[], step_slugs text[])
returns void
language plpgsql
stable
set search_path = ''
as $$
declare
  v_other record;
begin
  if not pgflow._session_is_step_role() then
    return;
  end if;
  select coalesce(r.flow_slug, '(unknown run)') as flow_slug, k.step_slug into v_other
  from unnest(run_ids, step_slugs) as k (run_id, step_slug)
  left join pgflow.runs as r on r.run_id = k.run_id
  where not exists (
    select 1 from pgflow.step_roles as sr
    where sr.role_name = session_user and sr.flow_slug = r.flow_slug and sr.step_slug = k.step_slug
  )
  limit 1;
  if found then
    perform pgflow._require_step_route(v_other.flow_slug, v_other.step_slug);
  end if;
end;
$$;

-- Refuses a queue that is no engine queue (SQLSTATE 42501: the functions that take a queue name
-- must not reach an application's own PGMQ queues), and a step role's session on a queue that is
-- not its step's. Called by set_vt_batch and enable_insert_notifications. No writes, no locks.
create function pgflow._require_queue_route(queue_name text)
returns void
language plpgsql
stable
set search_path = ''
as $$
declare
  v_queue text := lower(queue_name);
begin
  if not exists (select 1 from pgflow.steps as s where s.queue_name = v_queue)
    and not exists (select 1 from pgflow.flows as f where pgflow.default_queue_name(f.flow_slug) = v_queue) then
    raise exception 'Queue "%" is not a queue of the engine''s flows.', v_queue
      using errcode = '42501', hint = 'Only the queues of the flows in pgflow.flows may be named here.';
  end if;
  if pgflow._session_is_step_role()
    and not exists (
      select 1 from pgflow.step_roles as r
      join pgflow.steps as s on s.flow_slug = r.flow_slug and s.step_slug = r.step_slug
      where r.role_name = session_user and s.queue_name = v_queue
    ) then
    raise exception 'Role "%" may not work on queue "%".', session_user, v_queue
      using errcode = '42501', hint = 'Run each step''s worker with that step''s own role (pgflow-gen db roles --per-step).';
  end if;
end;
$$;

-- Refuses (SQLSTATE 42501) a step role's session that heartbeats or stops a worker registered for
-- another step; an unknown worker passes (the caller says so itself). Other sessions pass after
-- one index probe. Called by heartbeat_worker and mark_worker_stopped. No writes, no locks.
create function pgflow._require_worker_route(worker_id uuid)
returns void
language plpgsql
stable
set search_path = ''
as $$
declare
  v_worker record;
begin
  if not pgflow._session_is_step_role() then
    return;
  end if;
  select w.flow_slug, w.step_slug into v_worker
  from pgflow.workers as w where w.worker_id = _require_worker_route.worker_id;
  if found then
    perform pgflow._require_step_route(v_worker.flow_slug, v_worker.step_slug);
  end if;
end;
$$;

-- Checks a flow definition before it is compiled or verified: the shape is valid, every step has a
-- route in the queue mode (pgflow.derive_queue_routes), and a supplied route_map ([{stepSlug,
-- queueName}] in step order) is exactly the derived one (required in step mode). Returns the
-- queues in step order and the derived route map. Raises; no writes, no locks. Called by
-- ensure_flow_compiled and verify_flow_compiled.
create function pgflow._check_flow_definition(
  flow_slug text,
  shape jsonb,
  queue_mode text,
  route_map jsonb,
  out queues text[],
  out derived jsonb
)
language plpgsql
stable
set search_path = ''
as $$
declare
  v_step_slugs text[];
begin
  perform pgflow._validate_flow_shape(shape);
  v_step_slugs := array(select s.value ->> 'slug' from jsonb_array_elements(shape -> 'steps') as s);
  select coalesce(array_agg(r.queue_name order by r.step_index), '{}'),
    coalesce(jsonb_agg(jsonb_build_object('stepSlug', r.step_slug, 'queueName', r.queue_name) order by r.step_index), '[]')
  into queues, derived
  from pgflow.derive_queue_routes(flow_slug, v_step_slugs, queue_mode) as r;
  perform pgflow._check_route_map(flow_slug, queue_mode, derived, route_map);
end;
$$;

-- How a compiled flow differs from a definition: the shape (kind "shape"), else the queue mode and
-- the persisted route of every step (kind "routing"; compared even when the shape matches: a
-- changed resolver or a manual edit), with a line per difference. A null kind: it matches. The flow
-- must exist. No writes, no locks. Called by ensure_flow_compiled and verify_flow_compiled.
create function pgflow._flow_differences(
  flow_slug text,
  shape jsonb,
  queue_mode text,
  derived jsonb,
  out kind text,
  out differences text[]
)
language plpgsql
stable
set search_path = ''
as $$
declare
  v_mode text;
  v_persisted jsonb;
  v_routing text[] := '{}';
begin
  differences := pgflow._compare_flow_shapes(
    pgflow._normalize_flow_shape(shape), pgflow._get_flow_shape(flow_slug)
  );
  select f.queue_mode into v_mode from pgflow.flows as f where f.flow_slug = _flow_differences.flow_slug;
  if v_mode <> queue_mode then
    v_routing := v_routing || format('Queue mode of flow "%s" differs: expected "%s", persisted "%s"',
      flow_slug, queue_mode, v_mode);
  end if;
  -- With a different shape the steps do not line up, and the shape differences say enough.
  v_persisted := pgflow._get_queue_routes(flow_slug);
  if cardinality(differences) = 0 and v_persisted <> derived then
    v_routing := v_routing || array(
      select format('Route of step "%s" of flow "%s" differs: expected queue "%s", persisted "%s"',
        e.value ->> 'stepSlug', flow_slug, e.value ->> 'queueName', v_persisted -> (e.ordinality - 1)::int ->> 'queueName')
      from jsonb_array_elements(derived) with ordinality as e
      where e.value <> v_persisted -> (e.ordinality - 1)::int
      order by e.ordinality
    );
  end if;
  kind := case when cardinality(differences) > 0 then 'shape' when cardinality(v_routing) > 0 then 'routing' end;
  differences := differences || v_routing;
end;
$$;

-- Startup verification for a worker that may not compile (engine 0019: pgflow.ensure_flow_compiled
-- is an admin's): the same checks and the same result as ensure_flow_compiled, with status
-- "verified", "mismatch" (mismatchKind "shape" or "routing", and the differences) or "missing"
-- (the flow is not compiled: an admin applies its migration). Adopts no description and changes
-- nothing, whatever pgflow.local says. No locks.
create function pgflow.verify_flow_compiled(
  flow_slug text,
  shape jsonb,
  queue_mode text default 'flow',
  route_map jsonb default null
)
returns jsonb
language plpgsql
stable
security definer
set search_path = ''
as $$
declare
  v_derived jsonb;
  v_differences text[];
  v_kind text;
begin
  select c.derived into v_derived
  from pgflow._check_flow_definition(flow_slug, shape, queue_mode, route_map) as c;
  if not exists (select 1 from pgflow.flows as f where f.flow_slug = verify_flow_compiled.flow_slug) then
    return jsonb_build_object('status', 'missing', 'mismatchKind', null, 'differences', '[]'::jsonb);
  end if;
  select d.kind, d.differences into v_kind, v_differences
  from pgflow._flow_differences(flow_slug, shape, queue_mode, v_derived) as d;
  return jsonb_build_object('status', case when v_kind is null then 'verified' else 'mismatch' end,
    'mismatchKind', v_kind, 'differences', to_jsonb(v_differences));
end;
$$;

-- A run's input (null for an unknown run), for ctx.flow_input() of tasks that do not carry it
-- (engine 0019: workers read no table). A step role (pgflow.step_roles) reads only the input of a
-- run with a task of its own step (SQLSTATE 42501 otherwise). No writes, no locks.
create function pgflow.run_input(run_id uuid)
returns jsonb
language plpgsql
stable
security definer
set search_path = ''
as $$
begin
  if pgflow._session_is_step_role()
    and not exists (
      select 1 from pgflow.step_tasks as t
      join pgflow.step_roles as r on r.flow_slug = t.flow_slug and r.step_slug = t.step_slug
      where t.run_id = run_input.run_id and r.role_name = session_user
    ) then
    raise exception 'Role "%" may not read the input of run %.', session_user, run_id
      using errcode = '42501', detail = 'A step''s role reads the input of runs with a task of its step only.';
  end if;
  return (select r.input from pgflow.runs as r where r.run_id = run_input.run_id);
end;
$$;

-- Each given run's id and the trace context it was started in (engine 0016's runs.traceparent),
-- for the workers' tracing spans (engine 0019: workers read no table). No writes, no locks.
create function pgflow.run_trace_contexts(run_ids uuid[])
returns table (run_id uuid, traceparent text)
language sql
stable
security definer
set search_path = ''
as $$
  select r.run_id, r.traceparent from pgflow.runs as r where r.run_id = any (run_ids)
$$;

-- The flows' schedules as the scheduler plans them (engine 0019: workers read no table): each
-- schedule's cron, time zone, catch-up policy, last slot started, when it was stored and whether it
-- is paused. No writes, no locks.
create function pgflow.list_schedules()
returns table (
  flow_slug text, name text, cron text, timezone text, catch_up text, last_slot_at timestamptz,
  created_at timestamptz, paused boolean
)
language sql
stable
security definer
set search_path = ''
as $$
  select s.flow_slug, s.schedule_name, s.cron, s.timezone, s.catch_up, s.last_slot_at, s.created_at,
    s.paused_at is not null
  from pgflow.schedules as s
$$;

-- Startup compilation: creates a missing flow from its shape in its queue mode, verifies an
-- existing one (shape, then queue mode and the persisted route of every step), and on a
-- difference recompiles only in a local database (pgflow.local = on), else reports a mismatch of
-- kind "shape" or "routing" and changes nothing. The engine derives the routes itself: a supplied
-- route_map ([{stepSlug, queueName}] in step order) must be exactly the derived one (required in
-- step mode). A shape's description (its "inputSchema" and options: not compared) is adopted
-- when the flow is compiled or recompiled, and when it is verified unless the description is an
-- older one (_adopt_flow_description: "descriptionKept"); "optionsUpdated" lists the options it
-- changed. A result may carry a "summary" for people: what changed ("verified; options updated:
-- ...", "recompiled: 6 run(s) deleted", "verified; kept the options and input schema adopted
-- at ...").
-- Takes the flow's definition lock; any failure rolls back everything. An admin's function (it
-- writes definitions); a worker without it verifies (pgflow.verify_flow_compiled).
create or replace function pgflow.ensure_flow_compiled(
  flow_slug text,
  shape jsonb,
  queue_mode text default 'flow',
  route_map jsonb default null
)
returns jsonb
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_queues text[];
  v_derived jsonb;
  v_twin text;
  v_differences text[];
  v_kind text;
  v_description jsonb;
  v_options jsonb;
  v_deleted_runs bigint;
begin
  select c.queues, c.derived into v_queues, v_derived
  from pgflow._check_flow_definition(flow_slug, shape, queue_mode, route_map) as c;

  perform pgflow._lock_flow_definition(flow_slug);

  select f.flow_slug into v_twin from pgflow.flows as f
  where lower(f.flow_slug) = lower(ensure_flow_compiled.flow_slug) and f.flow_slug <> ensure_flow_compiled.flow_slug;
  if v_twin is not null then
    raise exception 'Flow "%" differs only in case from the existing flow "%".', flow_slug, v_twin
      using errcode = '23505', detail = 'Flow slugs are unique ignoring case.',
        hint = 'Use the existing spelling, or a different flow slug.';
  end if;

  if not exists (select 1 from pgflow.flows as f where f.flow_slug = ensure_flow_compiled.flow_slug) then
    perform pgflow._create_flow_from_shape(flow_slug, shape, queue_mode, v_queues);
    perform pgflow._adopt_flow_description(flow_slug, shape);
    return jsonb_build_object('status', 'compiled', 'mismatchKind', null, 'differences', '[]'::jsonb);
  end if;

  select d.kind, d.differences into v_kind, v_differences
  from pgflow._flow_differences(flow_slug, shape, queue_mode, v_derived) as d;
  if v_kind is null then
    v_description := pgflow._adopt_flow_description(flow_slug, shape);
    if (v_description ->> 'kept')::boolean then
      return jsonb_build_object('status', 'verified', 'mismatchKind', null, 'differences', '[]'::jsonb,
        'descriptionKept', true,
        'summary', format('verified; kept the options and input schema adopted at %s: this description of the flow is an older one',
          date_trunc('second', (v_description ->> 'adoptedAt')::timestamptz)));
    end if;
    v_options := v_description -> 'optionsUpdated';
    if jsonb_array_length(v_options) = 0 then
      return jsonb_build_object('status', 'verified', 'mismatchKind', null, 'differences', '[]'::jsonb);
    end if;
    return jsonb_build_object('status', 'verified', 'mismatchKind', null, 'differences', '[]'::jsonb,
      'optionsUpdated', v_options,
      'summary', 'verified; options updated: ' || (
        select string_agg(format('%s %s %s -> %s',
            case when c ->> 'step' is null then 'flow' else format('step "%s"', c ->> 'step') end,
            c ->> 'option', coalesce(c ->> 'from', 'the flow''s'), coalesce(c ->> 'to', 'the flow''s')),
          ', ' order by o)
        from jsonb_array_elements(v_options) with ordinality as x (c, o)
      ));
  end if;

  if coalesce(current_setting('pgflow.local', true), '') = 'on' then
    -- The new queues must be free before the old definition goes (its own queues count as free).
    perform pgflow._preflight_queue_names(flow_slug,
      case when queue_mode = 'flow' then array[pgflow.default_queue_name(flow_slug)] else v_queues end);
    select count(*) into v_deleted_runs from pgflow.runs as r where r.flow_slug = ensure_flow_compiled.flow_slug;
    perform pgflow.delete_flow_and_data(flow_slug);
    perform pgflow._create_flow_from_shape(flow_slug, shape, queue_mode, v_queues);
    perform pgflow._adopt_flow_description(flow_slug, shape);
    return jsonb_build_object('status', 'recompiled', 'mismatchKind', v_kind,
      'differences', to_jsonb(v_differences), 'deletedRuns', v_deleted_runs,
      'summary', format('recompiled: %s run(s) deleted', v_deleted_runs));
  end if;
  return jsonb_build_object('status', 'mismatch', 'mismatchKind', v_kind,
    'differences', to_jsonb(v_differences));
end;
$$;

-- Resumes a paused step: its held messages are visible again at once (those waiting for a
-- retry's delay keep waiting) and its queues' workers are woken, so its tasks start now. Resuming a step that
-- is not paused changes nothing. Returns how many messages were shown again.
-- Locks the held messages' task rows before their PGMQ rows, as every claim does.
create or replace function pgflow.resume_step(flow_slug text, step_slug text)
returns int
language plpgsql
volatile
security definer
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
    from pgflow._set_vt_batch(v_queue, v_messages, array_fill(0, array[cardinality(v_messages)]));
    v_shown := v_shown + v_count;
    -- Wake the queue's workers as an insert would, rather than leave it to their next poll.
    perform pg_notify('pgmq.' || pgflow.pgmq_table_name(v_queue) || '.INSERT', '');
  end loop;
  delete from pgflow.step_pauses as p
  where p.flow_slug = resume_step.flow_slug and p.step_slug = resume_step.step_slug;
  return v_shown;
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
security definer
set search_path = ''
as $$
declare
  v_locked record;
  v_task pgflow.step_tasks;
  v_output_type text := coalesce(jsonb_typeof(output), 'SQL NULL');
begin
  perform pgflow._require_task_routes(array[run_id], array[step_slug]);
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
  -- The place a keyed task freed goes to its key's next parked task now (engine 0018).
  if current_setting('pgflow.concurrency_passes', true) = 'pending' then
    perform pgflow._pass_concurrency_places();
  end if;

  perform pgmq.archive(v_task.queue_name, v_task.message_id);
  return next v_task;
end;
$$;

-- A worker reports a task's failure. With attempts left the task is queued again and its message
-- hidden for base_delay * 2^attempts seconds; exhausted (or parked by stall recovery),
-- when_exhausted decides: fail the run, skip the step, or skip it and everything downstream.
-- Locks run, step state and task (in that order, in one statement), then PGMQ rows.
-- Late callbacks change nothing, and so does a stale one (`attempt`, from claim_tasks, is not the
-- task's current attempt): the task's row comes back unchanged, a stale one's attempts_count
-- differing from `attempt`. A failure with a `permanent_reason` (engine 0011) is not retried,
-- whatever attempts are left; the stored error gets a second line that says so and why.
create or replace function pgflow.fail_task(
  run_id uuid, step_slug text, task_index int, error_message text, attempt int,
  permanent_reason text default null
)
returns setof pgflow.step_tasks
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_locked record;
  v_step record;
  v_task pgflow.step_tasks;
  v_delayed int;
  v_note text;
begin
  perform pgflow._require_task_routes(array[run_id], array[step_slug]);
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

  -- GUARD: a callback of an earlier attempt is stale and changes nothing: since that attempt,
  -- the task failed and was retried, or stall recovery requeued it, and another claim started
  -- the attempt that is current now. A null attempt answers whichever attempt is current.
  if attempt is not null and v_task.attempts_count <> attempt then
    return next v_task;
    return;
  end if;

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
  -- failure of a task whose message someone removed (nothing could deliver the retry), and a
  -- permanent one (the handler said no retry can succeed).
  if v_task.attempts_count < v_step.max_attempts and v_task.permanently_stalled_at is null
    and permanent_reason is null then
    select count(*) into v_delayed from pgflow._set_vt_batch(v_task.queue_name, array[v_task.message_id],
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

  if permanent_reason is not null then
    -- After the error's first line (its summary), before the traceback.
    v_note := format('Not retried (attempt %s of %s): %s', v_task.attempts_count, v_step.max_attempts,
      permanent_reason);
    error_message := case when strpos(error_message, E'\n') > 0
      then left(error_message, strpos(error_message, E'\n') - 1) || E'\n' || v_note
        || substr(error_message, strpos(error_message, E'\n'))
      else coalesce(error_message || E'\n', '') || v_note end;
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

-- Completes a batch of tasks in one call, as complete_task would one after another (a worker
-- reports the results it collected together). Returns each task's row afterwards, in input order.
--
-- The common case is done set-based, a handful of statements for the whole batch: a started task of
-- a single step whose children are all plain single steps (no condition, not a map). Its step
-- completes, every child whose last dependency finished starts (one message insert per queue for
-- the batch; a child with a concurrency key, engine 0018, is not plain), the tasks' messages are
-- archived (one call per queue), and runs with no step left complete. So are the tasks of a map
-- step that has more tasks left than the batch holds of it (engine 0014): they only count their
-- step down. Every other task (a map task that may finish its step, a step with a conditional or
-- map child, a late callback of a finished run) goes through complete_task, after the set-based
-- ones, in input order; so does a batch that names a task twice, and a batch of one (complete_task
-- is cheaper for a single task). `attempts` fences each result as complete_task's `attempt` does: a
-- stale one changes nothing and its row comes back unchanged.
--
-- A task that does not exist raises complete_task's error and changes nothing. Locks every run,
-- step state and task of the batch first, in key order, so concurrent batches cannot deadlock. The
-- rows locked are updated by their row ids (ctid; stable while we hold the lock), and the planner
-- settings keep every plan index-driven and its joins in the written order: these tables grow from
-- empty faster than autovacuum analyses them, and a sequential scan per batch would grow with them.
create or replace function pgflow.complete_tasks(
  run_ids uuid[], step_slugs text[], task_indexes int[], outputs jsonb[], attempts int[]
)
returns setof pgflow.step_tasks
language plpgsql
volatile
security definer
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
  perform pgflow._require_task_routes(run_ids, step_slugs);
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
            or c.forbidden_input_pattern is not null or c.opt_concurrency_key is not null)
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
  -- The places keyed tasks freed go to their keys' next parked tasks now (engine 0018).
  if current_setting('pgflow.concurrency_passes', true) = 'pending' then
    perform pgflow._pass_concurrency_places();
  end if;

  return query
  select t.*
  from unnest(run_ids, step_slugs, task_indexes) with ordinality as u (run_id, step_slug, task_index, ord)
  join pgflow.step_tasks as t
    on t.run_id = u.run_id and t.step_slug = u.step_slug and t.task_index = u.task_index
  order by u.ord;
end;
$$;

-- Recovers tasks whose worker vanished: the tasks pgflow.find_stalled_tasks names (worker gone,
-- or lease run out; never a task a live worker runs within its timeout). A stalled task is queued
-- again and its message made visible, at most 3 times; after that it is parked
-- (permanently_stalled_at) and its message archived. Skips locked tasks. Two statements: the
-- first locks the candidates, the second re-checks them with a fresh snapshot, so a task claimed a
-- moment ago by a worker that registered after the first statement began is left alone.
-- Also archives the completed tasks' messages still waiting in pgflow.archivable_messages, and
-- ends the signal steps whose wait ran out (_expire_signal_steps; not counted in the result).
create or replace function pgflow.requeue_stalled_tasks()
returns int
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_requeue_queues text[];
  v_requeue_messages bigint[];
  v_park_queues text[];
  v_park_messages bigint[];
  v_queue text;
  v_ids bigint[];
  v_run_ids uuid[];
  v_step_slugs text[];
  v_task_indexes int[];
begin
  -- Periodic maintenance is also where idle queues get their completed messages archived; first,
  -- before any task row is locked (the drain takes no task locks, so no order to invert).
  perform pgflow.archive_completed_messages();
  -- And where signal steps stop waiting once their timeout has passed (engine 0011).
  perform pgflow._expire_signal_steps();

  -- Lock the candidates (this statement's snapshot may predate a worker that claimed one since).
  select array_agg(x.run_id), array_agg(x.step_slug), array_agg(x.task_index)
  into v_run_ids, v_step_slugs, v_task_indexes
  from (
    select t.run_id, t.step_slug, t.task_index
    from pgflow.find_stalled_tasks() as c
    join pgflow.step_tasks as t
      on t.run_id = c.run_id and t.step_slug = c.step_slug and t.task_index = c.task_index
    for update of t skip locked
  ) as x;
  if v_run_ids is null then
    return 0;
  end if;

  -- GUARD: a new statement, a new snapshot: only the locked tasks that are still stalled change.
  with stalled as (
    select c.run_id, c.step_slug, c.task_index
    from pgflow.find_stalled_tasks() as c
    join unnest(v_run_ids, v_step_slugs, v_task_indexes) as k (run_id, step_slug, task_index)
      on k.run_id = c.run_id and k.step_slug = c.step_slug and k.task_index = c.task_index
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
    perform pgflow._set_vt_batch(v_queue, v_ids, array_fill(0, array[cardinality(v_ids)]));
  end loop;
  perform pgflow._archive_task_messages(v_park_queues, v_park_messages);
  return coalesce(cardinality(v_requeue_messages), 0);
end;
$$;

-- The route a claim takes its tasks from, checked once per claim (engine 0014): the flow's queue
-- mode decides the selector (a step-queued flow claims one step, named exactly, from that step's
-- own queue; a flow-mode flow takes no step). Returns the queue, the steps whose tasks the claim
-- may start with their effective timeouts, and the lease each claimed message gets when those
-- timeouts agree (timeout + 2 s; null when they differ). Raises on a wrong selector; no writes.
-- Called by claim_tasks and read_and_claim.
create or replace function pgflow._claim_route(
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
  perform pgflow._require_step_route(flow_slug, step_slug);
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

-- A worker process announces itself and the one queue it polls (and, for a step worker, its flow
-- and step). Re-registering the same worker id refreshes it. Called once at worker startup. A step
-- role (pgflow.step_roles) registers only for its own step and that step's queue.
create or replace function pgflow.register_worker(
  worker_id uuid,
  queue_name text,
  function_name text,
  flow_slug text default null,
  step_slug text default null
)
returns pgflow.workers
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_worker pgflow.workers;
begin
  perform pgflow._require_step_route(flow_slug, step_slug);
  if pgflow._session_is_step_role() then
    perform pgflow._require_queue_route(queue_name);
  end if;
  insert into pgflow.workers as w (worker_id, queue_name, function_name, flow_slug, step_slug)
  values (register_worker.worker_id, register_worker.queue_name, register_worker.function_name,
    register_worker.flow_slug, register_worker.step_slug)
  on conflict on constraint workers_pkey do update
  set queue_name = excluded.queue_name, function_name = excluded.function_name,
    flow_slug = excluded.flow_slug, step_slug = excluded.step_slug,
    last_heartbeat_at = clock_timestamp(), stopped_at = null
  returning w.* into v_worker;
  return v_worker;
end;
$$;

-- Refreshes a worker's heartbeat and tells it whether an operator deprecated it (then it stops
-- polling and drains). Raises for an unknown worker id. Called every few seconds by each worker.
create or replace function pgflow.heartbeat_worker(worker_id uuid)
returns boolean
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_deprecated boolean;
begin
  perform pgflow._require_worker_route(worker_id);
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

-- Records that a worker stopped (after draining). Idempotent. Called at worker shutdown; a step
-- role (pgflow.step_roles) stops only its own step's workers.
create or replace function pgflow.mark_worker_stopped(worker_id uuid)
returns void
language plpgsql
volatile
security definer
set search_path = ''
as $$
begin
  perform pgflow._require_worker_route(worker_id);
  update pgflow.workers as w set stopped_at = coalesce(w.stopped_at, clock_timestamp())
  where w.worker_id = mark_worker_stopped.worker_id;
end;
$$;

-- A live worker holding results it cannot send yet (the rows they need are locked, statements
-- time out) renews their tasks' leases, so stall recovery does not run them again: sets
-- lease_renewed_at on the given attempts that are still this worker's and started. Skips task
-- rows locked by someone else (a completion under way). Returns how many it renewed. Called
-- with each heartbeat while such results wait.
create or replace function pgflow.renew_task_leases(
  worker_id uuid,
  run_ids uuid[],
  step_slugs text[],
  task_indexes int[],
  attempts int[]
)
returns int
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_renewed int;
begin
  perform pgflow._require_task_routes(run_ids, step_slugs);
  with held as (
    select t.run_id, t.step_slug, t.task_index
    from unnest(run_ids, step_slugs, task_indexes, attempts) as k (run_id, step_slug, task_index, attempt)
    join pgflow.step_tasks as t
      on t.run_id = k.run_id and t.step_slug = k.step_slug and t.task_index = k.task_index
    where t.status = 'started' and t.attempts_count = k.attempt
      and t.last_worker_id = renew_task_leases.worker_id
    order by t.run_id, t.step_slug, t.task_index
    for update of t skip locked
  )
  update pgflow.step_tasks as t set lease_renewed_at = clock_timestamp()
  from held
  where t.run_id = held.run_id and t.step_slug = held.step_slug and t.task_index = held.task_index;
  get diagnostics v_renewed = row_count;
  return v_renewed;
end;
$$;

-- Makes inserts into a queue wake its listeners with one notification per statement (engine
-- 0013; the trigger pgflow_notify_insert runs pgflow._notify_queue_insert), in place of PGMQ's
-- per-row trigger (pgmq.enable_notify_insert), which it drops where one was made: that trigger
-- updates one throttle row per message, so a statement that inserts N messages (a map's fan-out)
-- cost O(N^2) as each update walked the row versions the statement made before. Keeps PGMQ's
-- throttle row of the queue where PGMQ has that table, so that a worker of an earlier release,
-- which looks for the row, does not add its trigger again. Idempotent; returns whether it
-- changed anything. Workers call it at startup, one at a time (an advisory lock).
create or replace function pgflow.enable_insert_notifications(queue_name text)
returns boolean
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_queue text := lower(queue_name);
  v_table regclass := to_regclass(format('pgmq.%I', pgflow.pgmq_table_name(queue_name)));
  v_changed boolean := false;
begin
  if v_table is null then
    raise exception 'Queue "%" does not exist.', v_queue using errcode = '42P01';
  end if;
  perform pgflow._require_queue_route(v_queue);
  if exists (
    select 1 from pg_catalog.pg_trigger as t
    where t.tgrelid = v_table and t.tgname = 'trigger_notify_queue_insert_listeners'
  ) then
    execute format('drop trigger trigger_notify_queue_insert_listeners on %s', v_table);
    v_changed := true;
  end if;
  if not exists (
    select 1 from pg_catalog.pg_trigger as t
    where t.tgrelid = v_table and t.tgname = 'pgflow_notify_insert'
  ) then
    execute format(
      'create trigger pgflow_notify_insert after insert on %s'
      ' for each statement execute function pgflow._notify_queue_insert()', v_table);
    v_changed := true;
  end if;
  if to_regclass('pgmq.notify_insert_throttle') is not null then
    execute 'insert into pgmq.notify_insert_throttle (queue_name, throttle_interval_ms)'
      ' select $1, 0 where not exists'
      ' (select 1 from pgmq.notify_insert_throttle as n where n.queue_name = $1)'
      using v_queue;
  end if;
  return v_changed;
end;
$$;

-- Settles a committing transaction's keyed tasks (engine 0018), a deferred constraint trigger on
-- pgflow.concurrency_events: its first firing takes every event of the transaction (later ones find
-- none pending) and, key by key in key order (so transactions never deadlock on the keys), counts
-- the places freed, drops finished tasks from the line, and gives the oldest parked tasks a message
-- while the key has room under its step's opt_concurrency_limit (no limit: all of them; a step's
-- start delay still applies). A parked task another transaction has locked (it is being cancelled,
-- and settles its key when it commits) is passed over. A key with nothing admitted and nothing
-- parked loses its row.
create or replace function pgflow._balance_concurrency_keys()
returns trigger
language plpgsql
security definer
set search_path = ''
set enable_seqscan = off
as $$
declare
  v_key record;
  v_limit int;
  v_admitted int;
begin
  -- The setting spares the later firings a look at the table, but the session could clear it:
  -- without it, the transaction's own events decide (engine 0019).
  if current_setting('pgflow.concurrency_events', true) is distinct from 'pending'
    and not exists (select 1 from pgflow.concurrency_events as e where e.xact = pg_current_xact_id()) then
    return null;
  end if;
  perform set_config('pgflow.concurrency_events', '', true);

  for v_key in
    with taken as (
      delete from pgflow.concurrency_events as e where e.xact = pg_current_xact_id() returning e.*
    )
    select t.flow_slug, t.step_slug, t.concurrency_key, sum(t.released)::int as released,
      bool_or(t.parked) as parked,
      array_agg(t.gone_run_id) filter (where t.gone_run_id is not null) as gone_runs,
      array_agg(t.gone_task_index) filter (where t.gone_run_id is not null) as gone_indexes
    from taken as t
    group by t.flow_slug, t.step_slug, t.concurrency_key
    order by t.flow_slug, t.step_slug, t.concurrency_key
  loop
    -- GUARD: a key whose freed places all went to parked tasks (pgflow._pass_concurrency_places)
    -- has nothing left to settle; its row is not locked.
    continue when v_key.released = 0 and not v_key.parked and v_key.gone_runs is null;
    select s.opt_concurrency_limit into v_limit
    from pgflow.steps as s where s.flow_slug = v_key.flow_slug and s.step_slug = v_key.step_slug;
    continue when not found;  -- the flow was deleted in this transaction
    insert into pgflow.concurrency_keys (flow_slug, step_slug, concurrency_key)
    values (v_key.flow_slug, v_key.step_slug, v_key.concurrency_key)
    on conflict on constraint concurrency_keys_pkey do nothing;
    select k.admitted - v_key.released into v_admitted
    from pgflow.concurrency_keys as k
    where k.flow_slug = v_key.flow_slug and k.step_slug = v_key.step_slug
      and k.concurrency_key = v_key.concurrency_key
    for update;
    v_admitted := greatest(v_admitted, 0);

    -- The parked rows of tasks that finished leave the line. One that another transaction's
    -- pick has locked (it found the task locked by this one) stays: a pick passes over it, as
    -- its task is not queued, and it goes with the task when the run is pruned.
    if v_key.gone_runs is not null then
      delete from pgflow.parked_tasks as p
      where p.ctid = any (array(
        select x.ctid from pgflow.parked_tasks as x
        where x.run_id = any (v_key.gone_runs) and x.step_slug = v_key.step_slug
          and (x.run_id, x.task_index) in (
            select g.run_id, g.task_index from unnest(v_key.gone_runs, v_key.gone_indexes) as g (run_id, task_index)
          )
        for update of x skip locked
      ));
    end if;

    if (v_limit is null or v_admitted < v_limit) and exists (
      select 1 from pgflow.parked_tasks as p
      where p.flow_slug = v_key.flow_slug and p.step_slug = v_key.step_slug
        and p.concurrency_key = v_key.concurrency_key
    ) then
      v_admitted := v_admitted + pgflow._unpark_tasks(v_key.flow_slug, v_key.step_slug,
        v_key.concurrency_key, v_limit - v_admitted);
    end if;

    if v_admitted = 0 and not exists (
      select 1 from pgflow.parked_tasks as p
      join pgflow.step_tasks as t
        on t.run_id = p.run_id and t.step_slug = p.step_slug and t.task_index = p.task_index
      where p.flow_slug = v_key.flow_slug and p.step_slug = v_key.step_slug
        and p.concurrency_key = v_key.concurrency_key and t.status = 'queued'
    ) then
      delete from pgflow.concurrency_keys as k
      where k.flow_slug = v_key.flow_slug and k.step_slug = v_key.step_slug
        and k.concurrency_key = v_key.concurrency_key;
    else
      update pgflow.concurrency_keys as k set admitted = v_admitted
      where k.flow_slug = v_key.flow_slug and k.step_slug = v_key.step_slug
        and k.concurrency_key = v_key.concurrency_key;
    end if;
  end loop;
  return null;
end;
$$;

-- Sets the visibility of several messages of one engine queue, each with its own offset in seconds
-- (pgflow._set_vt_batch), for a worker that read messages it hands back: refuses a queue that is
-- no engine queue, or another step's queue for a step role (pgflow._require_queue_route).
-- Locks the PGMQ rows it updates.
create or replace function pgflow.set_vt_batch(queue_name text, msg_ids bigint[], vt_offsets int[])
returns table (msg_id bigint, vt timestamptz)
language plpgsql
volatile
security definer
set search_path = ''
as $$
begin
  perform pgflow._require_queue_route(queue_name);
  return query select * from pgflow._set_vt_batch(queue_name, msg_ids, vt_offsets);
end;
$$;

-- Unchanged functions that now run as the engine's owner, for the roles granted them.
alter function pgflow.add_step(text, text, text[], integer, integer, integer, integer, text, jsonb, jsonb, text, text) security definer;
alter function pgflow.archive_completed_messages(text) security definer;
alter function pgflow.cancel_run(uuid, text) security definer;
alter function pgflow.claim_tasks(text, bigint[], uuid, text, text) security definer;
alter function pgflow.complete_and_claim(text, text, uuid, integer, integer, text, uuid[], text[], integer[], jsonb[], integer[]) security definer;
alter function pgflow.concurrency_usage(text) security definer;
alter function pgflow.create_flow(text, integer, integer, integer) security definer;
alter function pgflow.delete_flow_and_data(text) security definer;
alter function pgflow.find_stalled_tasks() security definer;
alter function pgflow.finished_tasks(interval, boolean) security definer;
alter function pgflow.pause_schedule(text, text) security definer;
alter function pgflow.pause_step(text, text, text) security definer;
alter function pgflow.prune_data_older_than(interval, integer) security definer;
alter function pgflow.queue_coverage(interval) security definer;
alter function pgflow.read_and_claim(text, text, uuid, integer, integer, text) security definer;
alter function pgflow.resume_schedule(text, text) security definer;
alter function pgflow.retry_run(uuid) security definer;
alter function pgflow.send_signal(uuid, text, jsonb) security definer;
alter function pgflow.set_step_limits(text, text, integer, integer, integer) security definer;
alter function pgflow.start_flow(text, jsonb, uuid, text) security definer;
alter function pgflow.start_flows(text, jsonb[], text[]) security definer;
alter function pgflow.start_scheduled_runs(text, text, timestamp with time zone[], timestamp with time zone) security definer;
alter function pgflow.step_limit_usage(text) security definer;

-- Least privilege (engine 0019): no engine function runs for PUBLIC. The functions a role may call
-- are security definer (they run as the engine's owner and check their caller), and `pgflow-gen db
-- roles` grants each group role its own; the owner and superusers keep doing everything. Functions
-- that later migrations add by the same owner start without PUBLIC's EXECUTE too.
revoke execute on all functions in schema pgflow from public;

alter default privileges in schema pgflow revoke execute on functions from public;

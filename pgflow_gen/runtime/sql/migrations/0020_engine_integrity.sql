-- Engine migration 0020: engine integrity. Every promise holds against any caller.
--
-- Attempt numbers of a task never repeat: retry_run keeps attempts_count and starts the retry
-- budget again from the new step_tasks.attempts_before_retry, so a late callback of an attempt
-- before the retry is stale for every fenced callback. A task stall recovery has requeued 3 times
-- is no longer parked for ever: each further stall fails its attempt ("Stalled N times: no live
-- worker kept it", pgflow._fail_attempt, shared with fail_task), which retries it while attempts
-- are left and else fails the run or skips the step, so retry_run can resume the run. Tasks an
-- older engine parked get a new message and are decided by the next stall sweep.
-- Step roles are decided by role membership (pgflow._session_step_roles) and outlive their steps,
-- so a role made `in role` a step role is held to its step, and a step role whose flow is deleted
-- or recompiled works on nothing (pgflow._require_flow_route) instead of as a plain worker.
-- A flow-mode claim reads only its flow's queue; register_worker takes only real routes and
-- bounded names, and a worker id belongs to the login role that registered it. Schedules start
-- no slot later than now, at most 100 a call, and never move their last slot past now. Only an
-- operator's session may change the liveness and stall rule for itself (pgflow._engine_settings).


-- The attempts a task made before its run's last retry_run (see 0062_table_step_tasks.sql).
alter table pgflow.step_tasks add column attempts_before_retry int not null default 0;

-- The login role that registered a worker id (see 0050_table_workers.sql); null for the workers
-- registered before this migration, which any role may still act as until they register again.
alter table pgflow.workers add column registered_by text;

-- A step role's row outlives its step (see 0044_table_step_roles.sql): the role stays bound to
-- its step's name when the flow is deleted or recompiled, instead of losing its row and working
-- as a plain worker.
alter table pgflow.step_roles drop constraint step_roles_flow_slug_step_slug_fkey;

-- The caller's own label beside the login role that acted (see 0066_table_operator_actions.sql).
alter table pgflow.operator_actions add column label text;

-- The pgflow.step_roles rows that bind this session (engine 0020): those of the step roles its
-- login role (session_user, which security definer functions and SET ROLE leave as it is) is or
-- belongs to, directly or through other roles (pg_has_role MEMBER, so a role made `in role` a step
-- role is held to that step too). None for a superuser (PostgreSQL counts one a member of every
-- role) or for the engine's owner. A row whose role was dropped binds nobody. No writes.
create function pgflow._session_step_roles()
returns setof pgflow.step_roles
language sql
stable
set search_path = ''
as $$
  select r.* from pgflow.step_roles as r
  join pg_catalog.pg_roles as g on g.rolname = r.role_name
  where pg_catalog.pg_has_role(session_user, g.oid, 'MEMBER')
    and not exists (
      select 1 from pg_catalog.pg_roles as u where u.rolname = session_user and u.rolsuper
    )
    and session_user <> (
      select pg_catalog.pg_get_userbyid(n.nspowner) from pg_catalog.pg_namespace as n
      where n.nspname = 'pgflow'
    )
$$;

-- Whether this session's login role (session_user) may set the engine's rules for itself (engine
-- 0020): a superuser, the engine's owner, or a member of the admin role `pgflow-gen db roles`
-- recorded (pgflow.engine_roles). Everyone else (workers, step roles, clients, readers) gets
-- the database's settings, never its own session's: see pgflow._database_setting. No writes.
create function pgflow._session_is_operator()
returns boolean
language sql
stable
set search_path = ''
as $$
  select exists (select 1 from pg_catalog.pg_roles as u where u.rolname = session_user and u.rolsuper)
    or session_user = (
      select pg_catalog.pg_get_userbyid(n.nspowner) from pg_catalog.pg_namespace as n
      where n.nspname = 'pgflow'
    )
    or exists (
      select 1 from pgflow.engine_roles as e
      join pg_catalog.pg_roles as g on g.rolname = e.role_name
      where e.kind = 'admin' and pg_catalog.pg_has_role(session_user, g.oid, 'MEMBER')
    )
$$;

-- The worker liveness settings (pgflow.heartbeat_interval, pgflow.live_within,
-- pgflow.stalled_after; null when unset) as this session must see them (engine 0020): the
-- session's own values when they are the database's (ALTER DATABASE ... SET; the usual case,
-- one catalog lookup) or the session is an operator's (pgflow._session_is_operator); else the
-- database's, whatever the session (or its role) set, so a worker cannot shorten the stall rule
-- and take live workers' tasks. Called by pgflow.worker_liveness. No writes.
create function pgflow._engine_settings(
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

-- Refuses (SQLSTATE 42501) a session bound by a step role (pgflow._session_step_roles) that has no
-- route among the steps that exist: in the given flow, or with a null flow in any flow (engine
-- 0020: a step role whose flow was deleted, or recompiled without its step, is refused everywhere
-- and never works as a plain worker). Called by the functions a worker calls for no one step:
-- requeue_stalled_tasks (any flow), start_scheduled_runs (its flow). Other sessions pass after
-- one probe. No writes, no locks.
create function pgflow._require_flow_route(flow_slug text)
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
    select 1 from pgflow._session_step_roles() as r
    join pgflow.steps as s on s.flow_slug = r.flow_slug and s.step_slug = r.step_slug
    where _require_flow_route.flow_slug is null or r.flow_slug = _require_flow_route.flow_slug
  ) then
    return;
  end if;
  select string_agg(format('step "%s" of flow "%s"', r.step_slug, r.flow_slug), ', ' order by r.flow_slug, r.step_slug)
  into v_routes from pgflow._session_step_roles() as r;
  if flow_slug is null then
    raise exception 'Role "%" is bound to a step that does not exist.', session_user
      using errcode = '42501', detail = format('It is the role of %s only.', v_routes),
        hint = 'Apply the flow''s migration again (its step roles work again for their steps), or drop the role.';
  end if;
  raise exception 'Role "%" may not work on flow "%".', session_user, flow_slug
    using errcode = '42501', detail = format('It is the role of %s only.', v_routes),
      hint = 'Run each step''s worker with that step''s own role (pgflow-gen db roles --per-step).';
end;
$$;

-- Refuses (SQLSTATE 42501) a session whose login role did not register the worker id it acts as
-- (engine 0020): `registered_by` is the worker's row's; null (a worker registered before 0020)
-- and the session's own login role pass at once, an operator (pgflow._session_is_operator) too.
-- Called by register_worker, the claims (pgflow._claim_messages) and _require_worker_route. No
-- writes, no locks.
create function pgflow._require_worker_owner(worker_id uuid, registered_by text)
returns void
language plpgsql
stable
set search_path = ''
as $$
begin
  if registered_by is null or registered_by = session_user or pgflow._session_is_operator() then
    return;
  end if;
  raise exception 'Worker % belongs to role "%"; role "%" may not act as it.', worker_id, registered_by, session_user
    using errcode = '42501', hint = 'Each worker process registers its own worker id (a new UUID) under its own role.';
end;
$$;

-- Fails the current attempt of a started task (engine 0020: shared by fail_task and stall
-- recovery). With attempts left in its budget (attempts_count - attempts_before_retry below the
-- step's max_attempts) the task is queued again and its message hidden for base_delay * 2^attempts
-- of this budget; exhausted, when_exhausted decides: fail the run, skip the step, or skip it and
-- everything downstream. No retry either for a permanent failure (a `permanent_reason`: the stored
-- error gets a second line that says so and why) or for a task whose message is gone (nothing
-- could deliver the retry). The caller holds the run, step state and task row locks (in that
-- order) and has checked that all three are started; PGMQ rows are touched last.
create function pgflow._fail_attempt(
  run_id uuid, step_slug text, task_index int, error_message text, permanent_reason text default null
)
returns pgflow.step_tasks
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_step record;
  v_task pgflow.step_tasks;
  v_attempt int;
  v_delayed int;
  v_note text;
begin
  select * into v_task from pgflow.step_tasks as t
  where t.run_id = _fail_attempt.run_id and t.step_slug = _fail_attempt.step_slug
    and t.task_index = _fail_attempt.task_index;
  select s.when_exhausted,
    coalesce(s.opt_max_attempts, f.opt_max_attempts) as max_attempts,
    coalesce(s.opt_base_delay, f.opt_base_delay) as base_delay
  into v_step
  from pgflow.steps as s
  join pgflow.flows as f on f.flow_slug = s.flow_slug
  where s.flow_slug = v_task.flow_slug and s.step_slug = v_task.step_slug;
  -- The attempt within the task's budget (the budget starts again with each retry_run).
  v_attempt := v_task.attempts_count - v_task.attempts_before_retry;

  if v_attempt < v_step.max_attempts and v_task.permanently_stalled_at is null
    and permanent_reason is null then
    select count(*) into v_delayed from pgflow._set_vt_batch(v_task.queue_name, array[v_task.message_id],
      array[pgflow.calculate_retry_delay(v_step.base_delay, v_attempt)]);
    if v_delayed = 1 then
      update pgflow.step_tasks as t
      set status = 'queued', started_at = null, error_message = _fail_attempt.error_message
      where t.run_id = _fail_attempt.run_id and t.step_slug = _fail_attempt.step_slug
        and t.task_index = _fail_attempt.task_index
      returning * into v_task;
      return v_task;
    end if;
  end if;

  if permanent_reason is not null then
    -- After the error's first line (its summary), before the traceback.
    v_note := format('Not retried (attempt %s of %s): %s', v_attempt, v_step.max_attempts, permanent_reason);
    error_message := case when strpos(error_message, E'\n') > 0
      then left(error_message, strpos(error_message, E'\n') - 1) || E'\n' || v_note
        || substr(error_message, strpos(error_message, E'\n'))
      else coalesce(error_message || E'\n', '') || v_note end;
  end if;
  update pgflow.step_tasks as t
  set status = 'failed', failed_at = clock_timestamp(), error_message = _fail_attempt.error_message
  where t.run_id = _fail_attempt.run_id and t.step_slug = _fail_attempt.step_slug
    and t.task_index = _fail_attempt.task_index
  returning * into v_task;

  if v_step.when_exhausted = 'fail' then
    update pgflow.step_states as ss
    set status = 'failed', failed_at = clock_timestamp(), remaining_tasks = null,
      error_message = _fail_attempt.error_message
    where ss.run_id = _fail_attempt.run_id and ss.step_slug = _fail_attempt.step_slug;
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
  return v_task;
end;
$$;

-- Records an operator's action in pgflow.operator_actions (engine 0020), from inside the action's
-- own function and transaction: the login role (session_user) as the actor, the server's clock,
-- and the caller's own label (the setting pgflow.action_label, at most 200 characters; null when
-- unset) apart. Called by cancel_run, retry_run, send_signal, pause_step, resume_step,
-- set_step_limits, pause_schedule and resume_schedule.
create function pgflow._record_action(
  action text, flow_slug text, run_id uuid, step_slug text, detail jsonb
)
returns void
language sql
volatile
set search_path = ''
as $$
  insert into pgflow.operator_actions (action, actor, run_id, flow_slug, step_slug, detail, acted_at, label)
  values (action, session_user, run_id, flow_slug, step_slug, detail, clock_timestamp(),
    left(nullif(current_setting('pgflow.action_label', true), ''), 200))
$$;

-- Whether this session may hear of a run (engine 0020): any session but one bound by a step role
-- (pgflow._session_step_roles), which sees only the runs with a task of its own step. The one
-- statement of the rule, for run_input, run_trace_contexts and cancelled_runs. No writes.
create function pgflow._session_sees_run(run_id uuid)
returns boolean
language plpgsql
stable
set search_path = ''
as $$
begin
  return not pgflow._session_is_step_role()
    or exists (
      select 1 from pgflow.step_tasks as t
      join pgflow._session_step_roles() as sr on sr.flow_slug = t.flow_slug and sr.step_slug = t.step_slug
      where t.run_id = _session_sees_run.run_id
    );
end;
$$;

-- The worker liveness rule, the one place in SQL that spells it: workers heartbeat every
-- heartbeat_interval; a worker counts as live (queue_coverage, `pgflow-gen workers`) while its
-- heartbeat is younger than live_within, and its tasks count as stalled (requeue_stalled_tasks)
-- once it is older than stalled_after. Defaults 5 s, 15 s and 30 s (pgflow_gen.runtime.liveness
-- is the Python twin); an operator may set pgflow.heartbeat_interval, pgflow.live_within and
-- pgflow.stalled_after per database (every session must see one rule). Only an operator's
-- session may set its own (engine 0020, pgflow._engine_settings): a worker's session sees the
-- database's, so it cannot shorten the stall rule (it runs as the owner to read them). Workers read
-- it when they start. No writes.
create or replace function pgflow.worker_liveness(
  out heartbeat_interval interval,
  out live_within interval,
  out stalled_after interval
)
language plpgsql
stable
parallel safe
security definer
set search_path = ''
as $$
declare
  v_set record := pgflow._engine_settings();
begin
  heartbeat_interval := coalesce(v_set.heartbeat_interval::interval, interval '5 seconds');
  live_within := coalesce(v_set.live_within::interval, interval '15 seconds');
  stalled_after := coalesce(v_set.stalled_after::interval, interval '30 seconds');
  -- GUARD: a live worker must never look stalled: at least two missed heartbeats before either;
  -- and a heartbeat at most ten times a second.
  if not (heartbeat_interval >= interval '0.1 seconds' and live_within >= 2 * heartbeat_interval
          and stalled_after >= live_within) then
    raise exception 'Inconsistent worker liveness settings: heartbeat every %, live within %, stalled after %.',
      heartbeat_interval, live_within, stalled_after
      using errcode = '22023',
        hint = 'Keep pgflow.heartbeat_interval >= 0.1 s, pgflow.live_within >= 2 x the heartbeat interval and pgflow.stalled_after >= pgflow.live_within.';
  end if;
end;
$$;

-- Whether this session is bound by a step role (pgflow._session_step_roles; engine 0020: by role
-- membership). Without any step role in the database, one probe of an empty table. The one
-- statement of the rule, for pgflow._require_step_route and the other checks. No writes.
create or replace function pgflow._session_is_step_role()
returns boolean
language plpgsql
stable
set search_path = ''
as $$
begin
  return exists (select 1 from pgflow.step_roles)
    and exists (select 1 from pgflow._session_step_roles());
end;
$$;

-- Refuses (SQLSTATE 42501) a session bound by a step role (pgflow._session_step_roles) when the
-- step route it works on is not its own; a null step (a flow-mode claim) is no step role's route.
-- Other sessions pass after one index probe. Called by the claims (pgflow._claim_route),
-- register_worker and the other pgflow._require_* checks. No writes, no locks.
create or replace function pgflow._require_step_route(flow_slug text, step_slug text)
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
    select 1 from pgflow._session_step_roles() as r
    where r.flow_slug = _require_step_route.flow_slug and r.step_slug = _require_step_route.step_slug
  ) then
    return;
  end if;
  select string_agg(format('step "%s" of flow "%s"', r.step_slug, r.flow_slug), ', ' order by r.flow_slug, r.step_slug)
  into v_routes from pgflow._session_step_roles() as r;
  raise exception 'Role "%" may not work on step "%" of flow "%".', session_user, coalesce(step_slug, '(any)'), flow_slug
    using errcode = '42501', detail = format('It is the role of %s only.', v_routes),
      hint = 'Run each step''s worker with that step''s own role (pgflow-gen db roles --per-step).';
end;
$$;

-- Refuses (SQLSTATE 42501) a step role's session that reports on, renews or reads a task of another
-- step (pgflow._require_step_route on the first such task; an unknown run counts as another step's).
-- Other sessions pass after one index probe. Called by complete_task, fail_task, complete_tasks,
-- renew_task_leases. No writes, no locks.
create or replace function pgflow._require_task_routes(run_ids uuid[], step_slugs text[])
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
    select 1 from pgflow._session_step_roles() as sr
    where sr.flow_slug = r.flow_slug and sr.step_slug = k.step_slug
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
create or replace function pgflow._require_queue_route(queue_name text)
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
      select 1 from pgflow._session_step_roles() as r
      join pgflow.steps as s on s.flow_slug = r.flow_slug and s.step_slug = r.step_slug
      where s.queue_name = v_queue
    ) then
    raise exception 'Role "%" may not work on queue "%".', session_user, v_queue
      using errcode = '42501', hint = 'Run each step''s worker with that step''s own role (pgflow-gen db roles --per-step).';
  end if;
end;
$$;

-- Refuses (SQLSTATE 42501) a session that heartbeats or stops a worker it did not register
-- (engine 0020: workers.registered_by is another login role; an operator, see
-- pgflow._session_is_operator, may), and a step role's session on a worker registered for another
-- step. An unknown worker passes (the caller says so itself). One index probe of the worker.
-- Called by heartbeat_worker and mark_worker_stopped. No writes, no locks.
create or replace function pgflow._require_worker_route(worker_id uuid)
returns void
language plpgsql
stable
set search_path = ''
as $$
declare
  v_worker record;
begin
  select w.flow_slug, w.step_slug, w.registered_by into v_worker
  from pgflow.workers as w where w.worker_id = _require_worker_route.worker_id;
  if not found then
    return;
  end if;
  perform pgflow._require_worker_owner(worker_id, v_worker.registered_by);
  if pgflow._session_is_step_role() then
    perform pgflow._require_step_route(v_worker.flow_slug, v_worker.step_slug);
  end if;
end;
$$;

-- A run's input (null for an unknown run), for ctx.flow_input() of tasks that do not carry it
-- (engine 0019: workers read no table). A step role reads only the input of a run with a task of
-- its own step (pgflow._session_sees_run; SQLSTATE 42501 otherwise). No writes, no locks.
create or replace function pgflow.run_input(run_id uuid)
returns jsonb
language plpgsql
stable
security definer
set search_path = ''
as $$
begin
  if not pgflow._session_sees_run(run_id) then
    raise exception 'Role "%" may not read the input of run %.', session_user, run_id
      using errcode = '42501', detail = 'A step''s role reads the input of runs with a task of its step only.';
  end if;
  return (select r.input from pgflow.runs as r where r.run_id = run_input.run_id);
end;
$$;

-- Each given run's id and the trace context it was started in (engine 0016's runs.traceparent),
-- for the workers' tracing spans (engine 0019: workers read no table). A step role gets only the
-- runs with a task of its own step (pgflow._session_sees_run, engine 0020). No writes, no locks.
create or replace function pgflow.run_trace_contexts(run_ids uuid[])
returns table (run_id uuid, traceparent text)
language plpgsql
stable
security definer
set search_path = ''
as $$
begin
  return query
    select r.run_id, r.traceparent from pgflow.runs as r
    where r.run_id = any (run_ids) and pgflow._session_sees_run(r.run_id);
end;
$$;

-- The flows' schedules as the scheduler plans them (engine 0019: workers read no table): each
-- schedule's cron, time zone, catch-up policy, last slot started, when it was stored and whether it
-- is paused. A step role (pgflow._session_step_roles; engine 0020) sees only its own flows'. No
-- writes, no locks.
create or replace function pgflow.list_schedules()
returns table (
  flow_slug text, name text, cron text, timezone text, catch_up text, last_slot_at timestamptz,
  created_at timestamptz, paused boolean
)
language plpgsql
stable
security definer
set search_path = ''
as $$
declare
  v_step_role boolean := pgflow._session_is_step_role();
begin
  return query
    select s.flow_slug, s.schedule_name, s.cron, s.timezone, s.catch_up, s.last_slot_at, s.created_at,
      s.paused_at is not null
    from pgflow.schedules as s
    where not v_step_role
      or s.flow_slug in (select sr.flow_slug from pgflow._session_step_roles() as sr);
end;
$$;

-- Starts a schedule's runs for the given slots (engine 0017), each once whoever calls and however
-- often: a slot at or before the schedule's last_slot_at is passed over, and every run carries
-- the idempotency key "schedule:<name>:<slot in UTC>" (a race or a retry returns the run the key
-- started). Then moves last_slot_at to the latest of the slots and passed_through (the latest
-- slot the caller decided not to start: catch_up none or latest). A paused schedule starts
-- nothing and moves nothing. The scheduler in each worker computes the slots from the cron
-- expression; this function keeps the promise of once per slot, and bounds what a caller can
-- bend (engine 0020): a slot later than now is not started, nor one that no cron expression can
-- name (not a whole minute, or a whole second for a six-field expression, so a caller starts at
-- most one run per minute since the last slot), at most the latest 100 slots of a call start
-- (the documented catch-up maximum), last_slot_at never moves past now, and a step role starts
-- only its own flow's schedules. The cron expression itself is the scheduler's to read. Returns each slot it handled with its run and
-- whether this call started it. Locks the schedule's row.
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
  -- The slots that may start: past ones a cron expression can name, after the last slot, the
  -- latest 100 (MAX_CATCH_UP).
  v_unit := case when cardinality(regexp_split_to_array(btrim(v_schedule.cron), '\s+')) = 6
    then 'second' else 'minute' end;
  v_slots := array(
    select x.s from (
      select distinct s from unnest(slots) as s
      where s > coalesce(v_schedule.last_slot_at, '-infinity'::timestamptz) and s <= v_now
        and s = date_trunc(v_unit, s)
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

-- Deletes a flow's definition and all its runtime data (archiving its unfinished tasks' messages),
-- and drops the queues its queue mode owns: the steps' routes, plus the default queue in flow mode
-- only (a step-queued flow never touches an unrelated queue of that name). A queue is dropped
-- under the spelling PGMQ lists for it (two spellings are refused as ambiguous), and kept while
-- another flow still routes to it.
-- Its step roles (pgflow.step_roles) stay bound to their steps' names (engine 0020): they work on
-- nothing until the flow is applied again with those steps, and never as plain workers; a notice
-- names them.
-- Takes the flow's definition lock, then its runs' row locks; does nothing for an unknown flow.
create or replace function pgflow.delete_flow_and_data(flow_slug text)
returns void
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_queues text[];
  v_queue text;
  v_active_queues text[];
  v_active_messages bigint[];
  v_mode text;
  v_listed text[];
  v_bound text;
begin
  perform pgflow._lock_flow_definition(flow_slug);
  select f.queue_mode into v_mode from pgflow.flows as f where f.flow_slug = delete_flow_and_data.flow_slug;
  if not found then
    return;
  end if;

  v_queues := array(
    select s.queue_name from pgflow.steps as s where s.flow_slug = delete_flow_and_data.flow_slug
    union
    select pgflow.default_queue_name(delete_flow_and_data.flow_slug) where v_mode = 'flow'
  );

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
  select string_agg(r.role_name, ', ' order by r.role_name) into v_bound
  from pgflow.step_roles as r where r.flow_slug = delete_flow_and_data.flow_slug;
  if v_bound is not null then
    raise notice 'Step roles of flow "%" stay bound to their steps: %.', flow_slug, v_bound
      using detail = 'They work on nothing until the flow is applied again with those steps, and never as plain workers.',
        hint = '`pgflow-gen db roles` lists step roles whose step does not exist; drop those no longer needed.';
  end if;

  foreach v_queue in array v_queues loop
    continue when exists (select 1 from pgflow.steps as s where s.queue_name = v_queue)
      or exists (select 1 from pgflow.flows as f where f.queue_mode = 'flow' and pgflow.default_queue_name(f.flow_slug) = v_queue);
    v_listed := array(select q.queue_name from pgmq.list_queues() as q where lower(q.queue_name) = v_queue);
    if cardinality(v_listed) > 1 then
      -- PGMQ names a queue's tables in lowercase: these spellings are one physical queue.
      raise exception 'The queue "%" of flow "%" is ambiguous.', v_queue, flow_slug
        using errcode = '42710',
          detail = format('PGMQ lists %s for the same tables; nothing was deleted.', array_to_string(v_listed, ', ')),
          hint = 'Remove the extra rows from pgmq.meta (never pgmq.drop_queue, which drops the shared tables), then delete again.';
    end if;
    if cardinality(v_listed) = 1 then
      perform pgmq.drop_queue(v_listed[1]);
    end if;
    delete from pgflow.archivable_messages as m where m.queue_name = v_queue;
  end loop;
end;
$$;

-- A worker process announces itself and the one queue it polls (and, for a step worker, its flow
-- and step). Re-registering the same worker id refreshes it. Called once at worker startup. A step
-- role (pgflow._session_step_roles) registers only for its own step and that step's queue.
-- Registers only real routes (engine 0020): the queue is an engine queue; with a flow, the flow
-- exists and the queue is its default queue or one of its steps' (with a step, that step's own);
-- a step needs its flow; the function name is at most 200 characters. The worker id belongs to the
-- login role that registered it first (workers.registered_by): another role is refused
-- (pgflow._require_worker_owner). Locks the worker's row.
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
  v_queue text := lower(queue_name);
  v_owner text;
begin
  perform pgflow._require_step_route(flow_slug, step_slug);
  perform pgflow._require_queue_route(queue_name);
  if char_length(function_name) > 200 then
    raise exception 'A worker''s function name has at most 200 characters, not %.', char_length(function_name)
      using errcode = '22001';
  end if;
  if step_slug is not null and flow_slug is null then
    raise exception 'A worker of step "%" needs its flow.', step_slug using errcode = '22023';
  end if;
  if flow_slug is not null then
    if not exists (select 1 from pgflow.flows as f where f.flow_slug = register_worker.flow_slug) then
      raise exception 'Flow "%" does not exist.', flow_slug
        using errcode = 'P0002', hint = 'Apply the flow''s migration (pgflow-gen db apply) before its workers start.';
    end if;
    if not exists (
      select 1 from pgflow.steps as s
      where s.flow_slug = register_worker.flow_slug and s.queue_name = v_queue
        and (register_worker.step_slug is null or s.step_slug = register_worker.step_slug)
    ) and not (step_slug is null and v_queue = pgflow.default_queue_name(flow_slug)) then
      raise exception 'Flow "%" has no route % on queue "%".', flow_slug,
        coalesce(format('for step "%s"', step_slug), 'for its steps'), v_queue
        using errcode = '22023', hint = 'Register the queue the flow routes the worker''s steps to.';
    end if;
  end if;
  select w.registered_by into v_owner from pgflow.workers as w
  where w.worker_id = register_worker.worker_id for update;
  if found then
    perform pgflow._require_worker_owner(worker_id, v_owner);
  end if;
  insert into pgflow.workers as w (worker_id, queue_name, function_name, flow_slug, step_slug, registered_by)
  values (register_worker.worker_id, register_worker.queue_name, register_worker.function_name,
    register_worker.flow_slug, register_worker.step_slug, session_user)
  on conflict on constraint workers_pkey do update
  set queue_name = excluded.queue_name, function_name = excluded.function_name,
    flow_slug = excluded.flow_slug, step_slug = excluded.step_slug,
    last_heartbeat_at = clock_timestamp(), stopped_at = null, registered_by = excluded.registered_by
  returning w.* into v_worker;
  return v_worker;
end;
$$;

-- The route a claim takes its tasks from, checked once per claim (engine 0014): the flow's queue
-- mode decides the selector (a step-queued flow claims one step, named exactly, from that step's
-- own queue; a flow-mode flow takes no step). Returns the queue, the steps whose tasks the claim
-- may start with their effective timeouts, and the lease each claimed message gets when those
-- timeouts agree (timeout + 2 s; null when they differ). Raises on a wrong selector, and on a queue
-- that is not the route's (engine 0020: in flow mode too); no writes.
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
  -- GUARD: a flow-mode claim reads only the flow's own queue (engine 0020), never another queue
  -- of PGMQ's (an application's own, or another flow's).
  if v_mode = 'flow' and queue <> pgflow.default_queue_name(flow_slug) then
    raise exception 'Flow "%" uses queue "%", not "%".', flow_slug, pgflow.default_queue_name(flow_slug), queue
      using errcode = '42501', hint = 'Claim with the messages read from the flow''s own queue.';
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
-- is registered again (a claim proves it alive). Only the login role that registered the worker
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

-- A worker reports a task's failure: its current attempt fails (pgflow._fail_attempt: queued
-- again after base_delay * 2^attempts with attempts left in its budget; exhausted, when_exhausted
-- decides: fail the run, skip the step, or skip it and everything downstream). A failure with a
-- `permanent_reason` (engine 0011) is not retried, whatever attempts are left.
-- Locks run, step state and task (in that order, in one statement), then PGMQ rows.
-- Late callbacks change nothing, and so does a stale one (`attempt`, from claim_tasks, is not the
-- task's current attempt; attempt numbers never repeat, engine 0020): the task's row comes back
-- unchanged, a stale one's attempts_count differing from `attempt`.
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
  v_task pgflow.step_tasks;
begin
  perform pgflow._require_task_routes(array[run_id], array[step_slug]);
  select r.status as run_status, ss.status as step_status, t as task into v_locked
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

  -- GUARD: late callbacks are no-ops (cancellation and skips win).
  if v_locked.run_status <> 'started' or v_task.status <> 'started' or v_locked.step_status <> 'started' then
    return next v_task;
    return;
  end if;

  return next pgflow._fail_attempt(run_id, step_slug, task_index, error_message, permanent_reason);
end;
$$;

-- Retries a failed run from where it failed. Its failed steps, and the steps it left unfinished
-- when it failed, run again: every task of theirs that did not complete (it failed, or the failure
-- cancelled it) is queued again with a fresh message (a keyed one is parked, engine 0018) and its
-- whole retry budget, keeping its last error. Its attempt numbers go on (engine 0020: the budget
-- counts from attempts_before_retry), so a late result of an attempt before the retry stays stale.
-- Completed tasks and steps keep their outputs and do not run again (in a map only the failed and
-- unfinished elements run); skipped steps stay skipped. A step that failed without a task (a
-- condition with when_unmet = fail, a signal that did not come) is ready again and decided anew,
-- and a signal step that waits starts a new wait. The run is started again (retry_count + 1,
-- retried_at); one event, run:retried.
-- Refused, changing nothing: an unknown run (P0002), a run that is not failed, or one whose flow
-- has gained a step since it started (55000). Locks the run, its step states and its tasks, in
-- that order, as every callback does; then it sends the new messages.
create or replace function pgflow.retry_run(run_id uuid)
returns pgflow.runs
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_run pgflow.runs;
  v_added text;
  v_queue text;
  v_keys jsonb;
  v_sent record;
begin
  select * into v_run from pgflow.runs as r where r.run_id = retry_run.run_id for update;
  if not found then
    raise exception 'Run % does not exist.', run_id using errcode = 'P0002';
  end if;
  if v_run.status <> 'failed' then
    raise exception 'Run % is %; only a failed run can be retried.', run_id, v_run.status
      using errcode = '55000', hint = 'Nothing was changed.';
  end if;
  -- GUARD: the run's steps must still be its flow's (add_step can extend a flow-mode flow).
  select s.step_slug into v_added from pgflow.steps as s
  where s.flow_slug = v_run.flow_slug
    and not exists (
      select 1 from pgflow.step_states as ss where ss.run_id = retry_run.run_id and ss.step_slug = s.step_slug
    )
  order by s.step_index
  limit 1;
  if v_added is not null then
    raise exception 'Run % cannot be retried: flow "%" has changed since it started.', run_id, v_run.flow_slug
      using errcode = '55000', detail = format('Step "%s" was added to the flow after the run started.', v_added),
        hint = 'Nothing was changed. Start a new run.';
  end if;

  perform 1 from pgflow.step_states as ss
  where ss.run_id = retry_run.run_id and ss.status in ('created', 'started', 'failed')
  order by ss.step_slug
  for update;
  perform 1 from pgflow.step_tasks as t
  join pgflow.step_states as ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug
  where t.run_id = retry_run.run_id and ss.status in ('started', 'failed')
    and t.status in ('failed', 'cancelled')
  order by t.step_slug, t.task_index
  for update of t;

  -- The tasks that did not complete are queued again, each with a new message (visible now).
  for v_queue, v_keys in
    select t.queue_name, jsonb_agg(jsonb_build_object(
        'flow_slug', t.flow_slug, 'run_id', t.run_id, 'step_slug', t.step_slug, 'task_index', t.task_index
      ) order by t.step_slug, t.task_index)
    from pgflow.step_tasks as t
    join pgflow.step_states as ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug
    where t.run_id = retry_run.run_id and ss.status in ('started', 'failed')
      and t.status in ('failed', 'cancelled') and t.concurrency_key is null
    group by t.queue_name
    order by t.queue_name
  loop
    for v_sent in execute format(
      'insert into pgmq.%I (vt, message) select clock_timestamp(), k.value from jsonb_array_elements($1) as k'
      ' returning msg_id, message ->> ''step_slug'' as step_slug, (message ->> ''task_index'')::int as task_index',
      pgflow.pgmq_table_name(v_queue))
      using v_keys
    loop
      update pgflow.step_tasks as t
      set status = 'queued', message_id = v_sent.msg_id, attempts_before_retry = t.attempts_count,
        queued_at = clock_timestamp(),
        started_at = null, failed_at = null, output = null, last_worker_id = null, requeued_count = 0,
        last_requeued_at = null, permanently_stalled_at = null, claimed_timeout = null, lease_renewed_at = null
      where t.run_id = retry_run.run_id and t.step_slug = v_sent.step_slug and t.task_index = v_sent.task_index;
    end loop;
  end loop;

  -- A keyed task (engine 0018) is queued without a message: it is parked, and gets one when its
  -- key has room.
  update pgflow.step_tasks as t
  set status = 'queued', message_id = null, attempts_before_retry = t.attempts_count,
    queued_at = clock_timestamp(),
    started_at = null, failed_at = null, output = null, last_worker_id = null, requeued_count = 0,
    last_requeued_at = null, permanently_stalled_at = null, claimed_timeout = null, lease_renewed_at = null
  from pgflow.step_states as ss
  where t.run_id = retry_run.run_id and ss.run_id = t.run_id and ss.step_slug = t.step_slug
    and ss.status in ('started', 'failed') and t.status in ('failed', 'cancelled')
    and t.concurrency_key is not null;

  -- Steps with tasks run again (their unfinished tasks are queued); failed ones without (a
  -- condition, a signal) are ready again; a waiting signal step waits anew.
  with counts as (
    select ss.step_slug, ss.status, s.step_type, count(x.task_index)::int as tasks,
      count(x.task_index) filter (where x.status <> 'completed')::int as unfinished
    from pgflow.step_states as ss
    join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    left join pgflow.step_tasks as x on x.run_id = ss.run_id and x.step_slug = ss.step_slug
    where ss.run_id = retry_run.run_id and ss.status in ('started', 'failed')
    group by ss.step_slug, ss.status, s.step_type
  )
  update pgflow.step_states as ss
  set status = case when c.status = 'failed' and c.tasks = 0 then 'created' else 'started' end,
    remaining_tasks = case when c.tasks > 0 then c.unfinished when c.status = 'started' then ss.remaining_tasks end,
    started_at = case when c.step_type = 'signal' then clock_timestamp() else ss.started_at end,
    failed_at = null, error_message = null
  from counts as c
  where ss.run_id = retry_run.run_id and ss.step_slug = c.step_slug;

  update pgflow.runs as r
  set status = 'started', failed_at = null, retry_count = r.retry_count + 1, retried_at = clock_timestamp()
  where r.run_id = retry_run.run_id;
  perform pgflow._emit_event(run_id, 'run:retried', null, 'started');
  perform pgflow._record_action('retry', v_run.flow_slug, run_id, null, null);
  -- Steps ready but never started when the run failed, and the ones made ready above.
  perform pgflow._advance_run(run_id);

  select * into v_run from pgflow.runs as r where r.run_id = retry_run.run_id;
  return v_run;
end;
$$;

-- Recovers tasks whose worker vanished: the tasks pgflow.find_stalled_tasks names (worker gone,
-- or lease run out; never a task a live worker runs within its timeout). A stalled task is queued
-- again and its message made visible, at most 3 times (without using an attempt of its budget);
-- after that the engine gives up on it (engine 0020): each further stall fails the attempt
-- ("Stalled N times: no live worker kept it"), which then follows the step's policy like any
-- failure (pgflow._fail_attempt: retried after its delay while attempts are left, else the run
-- fails or the step is skipped), so no run waits for ever on a task nobody holds.
-- Skips locked tasks (and, for the tasks it gives up on, locked runs and step states). Locks
-- those in the engine's order (run, step state, task), then the tasks to requeue; a second
-- statement re-checks every locked task with a fresh snapshot, so a task claimed a moment ago by
-- a worker that registered after the first statement began is left alone.
-- Also archives the completed tasks' messages still waiting in pgflow.archivable_messages, and
-- ends the signal steps whose wait ran out (_expire_signal_steps; not counted in the result).
-- Returns the number of tasks requeued or failed.
create or replace function pgflow.requeue_stalled_tasks()
returns int
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_up_runs uuid[];
  v_up_steps text[];
  v_up_indexes int[];
  v_run_ids uuid[];
  v_step_slugs text[];
  v_task_indexes int[];
  v_queue text;
  v_ids bigint[];
  v_given_up record;
  v_failed int := 0;
  v_requeue_queues text[];
  v_requeue_messages bigint[];
begin
  -- A step role whose step is gone does nothing here either (engine 0020).
  perform pgflow._require_flow_route(null);
  -- Periodic maintenance is also where idle queues get their completed messages archived; first,
  -- before any task row is locked (the drain takes no task locks, so no order to invert).
  perform pgflow.archive_completed_messages();
  -- And where signal steps stop waiting once their timeout has passed (engine 0011).
  perform pgflow._expire_signal_steps();

  -- The candidates, without locks (this statement's snapshot may predate a worker that claimed
  -- one since): the ones requeued 3 times already are given up on.
  select
    array_agg(t.run_id) filter (where t.requeued_count >= 3),
    array_agg(t.step_slug) filter (where t.requeued_count >= 3),
    array_agg(t.task_index) filter (where t.requeued_count >= 3),
    array_agg(t.run_id) filter (where t.requeued_count < 3),
    array_agg(t.step_slug) filter (where t.requeued_count < 3),
    array_agg(t.task_index) filter (where t.requeued_count < 3)
  into v_up_runs, v_up_steps, v_up_indexes, v_run_ids, v_step_slugs, v_task_indexes
  from pgflow.find_stalled_tasks() as c
  join pgflow.step_tasks as t
    on t.run_id = c.run_id and t.step_slug = c.step_slug and t.task_index = c.task_index;
  if v_up_runs is null and v_run_ids is null then
    return 0;
  end if;

  -- Lock the tasks to give up on with their runs and step states, in the engine's order and
  -- skipping any row someone holds (a callback or a claim on it right now decides it instead).
  select array_agg(x.run_id), array_agg(x.step_slug), array_agg(x.task_index)
  into v_up_runs, v_up_steps, v_up_indexes
  from (
    select t.run_id, t.step_slug, t.task_index
    from unnest(v_up_runs, v_up_steps, v_up_indexes) as k (run_id, step_slug, task_index)
    join pgflow.runs as r on r.run_id = k.run_id
    join pgflow.step_states as ss on ss.run_id = k.run_id and ss.step_slug = k.step_slug
    join pgflow.step_tasks as t on t.run_id = k.run_id and t.step_slug = k.step_slug and t.task_index = k.task_index
    order by k.run_id, k.step_slug, k.task_index
    for update of r, ss, t skip locked
  ) as x;
  -- Then the tasks to requeue (task rows only: nothing else changes for them).
  select array_agg(x.run_id), array_agg(x.step_slug), array_agg(x.task_index)
  into v_run_ids, v_step_slugs, v_task_indexes
  from (
    select t.run_id, t.step_slug, t.task_index
    from unnest(v_run_ids, v_step_slugs, v_task_indexes) as k (run_id, step_slug, task_index)
    join pgflow.step_tasks as t on t.run_id = k.run_id and t.step_slug = k.step_slug and t.task_index = k.task_index
    for update of t skip locked
  ) as x;

  -- GUARD: a new statement, a new snapshot: only the locked tasks that are still stalled change.
  for v_given_up in
    select c.run_id, c.step_slug, c.task_index, t.requeued_count
    from pgflow.find_stalled_tasks() as c
    join unnest(v_up_runs, v_up_steps, v_up_indexes) as k (run_id, step_slug, task_index)
      on k.run_id = c.run_id and k.step_slug = c.step_slug and k.task_index = c.task_index
    join pgflow.step_tasks as t
      on t.run_id = c.run_id and t.step_slug = c.step_slug and t.task_index = c.task_index
    order by c.run_id, c.step_slug, c.task_index
  loop
    -- An earlier task of the same run may have failed it since: then this one was cancelled.
    if exists (
      select 1 from pgflow.step_tasks as t
      join pgflow.step_states as ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug
      join pgflow.runs as r on r.run_id = t.run_id
      where t.run_id = v_given_up.run_id and t.step_slug = v_given_up.step_slug
        and t.task_index = v_given_up.task_index
        and t.status = 'started' and ss.status = 'started' and r.status = 'started'
    ) then
      perform pgflow._fail_attempt(v_given_up.run_id, v_given_up.step_slug, v_given_up.task_index,
        format('Stalled %s times: no live worker kept it', v_given_up.requeued_count + 1));
      v_failed := v_failed + 1;
    end if;
  end loop;

  with stalled as (
    select c.run_id, c.step_slug, c.task_index
    from pgflow.find_stalled_tasks() as c
    join unnest(v_run_ids, v_step_slugs, v_task_indexes) as k (run_id, step_slug, task_index)
      on k.run_id = c.run_id and k.step_slug = c.step_slug and k.task_index = c.task_index
  ),
  changed as (
    update pgflow.step_tasks as t
    set status = 'queued', started_at = null, last_worker_id = null,
      requeued_count = t.requeued_count + 1, last_requeued_at = clock_timestamp()
    from stalled
    where t.run_id = stalled.run_id and t.step_slug = stalled.step_slug and t.task_index = stalled.task_index
    returning t.queue_name, t.message_id
  )
  select array_agg(c.queue_name), array_agg(c.message_id)
  into v_requeue_queues, v_requeue_messages
  from changed as c;

  -- Requeued tasks become visible at once.
  for v_queue in select distinct q from unnest(v_requeue_queues) as q loop
    v_ids := array(select x.m from unnest(v_requeue_queues, v_requeue_messages) as x (q, m) where x.q = v_queue);
    perform pgflow._set_vt_batch(v_queue, v_ids, array_fill(0, array[cardinality(v_ids)]));
  end loop;
  return coalesce(cardinality(v_requeue_messages), 0) + v_failed;
end;
$$;

-- The given runs that are cancelled (engine 0020), for a worker to confirm a run:cancelled
-- notification before it stops the run's handlers: PostgreSQL has no privilege on NOTIFY, so
-- any role that can connect can send one, and a notification is a hint, never an order. A step
-- role hears only of runs with a task of its own step (pgflow._session_sees_run). No writes,
-- no locks.
create function pgflow.cancelled_runs(run_ids uuid[])
returns setof uuid
language plpgsql
stable
security definer
set search_path = ''
as $$
begin
  return query
    select r.run_id from pgflow.runs as r
    where r.run_id = any (run_ids) and r.status = 'cancelled' and pgflow._session_sees_run(r.run_id);
end;
$$;

-- Cancels a started run: the run becomes cancelled (with cancelled_at and the reason), every
-- step that had not finished becomes cancelled, and so does every queued or started task, whose
-- message is archived. Late callbacks of its tasks change nothing (their task is no longer
-- started), and no step of it starts again. One event, run:cancelled; and the queues of the
-- tasks that were running are told (their workers listen there), so the handlers stop.
-- A run that is not started raises (object_not_in_prerequisite_state) and changes nothing.
-- Locks the run, its step states and its tasks, in that order, as every callback does.
create or replace function pgflow.cancel_run(run_id uuid, reason text default null)
returns pgflow.runs
language plpgsql
volatile
security definer
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
  perform pgflow._record_action('cancel', v_run.flow_slug, run_id, null,
    case when reason is not null then jsonb_build_object('reason', reason) end);
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

-- Delivers a signal to a signal step of a started run: the payload, checked against the step's
-- payload schema, becomes the step's output. A waiting step completes at once and the run moves
-- on; a step that is not ready yet keeps the signal until it is. Returns the signal's row (used_at
-- set when its step took it now, null while it waits for its step); one event, signal:received.
-- Refused, changing nothing: an unknown run or step (P0002), a step that is not a signal step or
-- a payload that does not match (22023), a run that is not started, a step that finished or
-- whose wait ran out (55000), a second signal for the step (23505).
-- Locks the run, then the step state, as every callback does.
create or replace function pgflow.send_signal(run_id uuid, step_slug text, payload jsonb)
returns pgflow.signals
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_run pgflow.runs;
  v_step pgflow.steps;
  v_state pgflow.step_states;
  v_signal pgflow.signals;
  v_signal_steps text;
  v_problem text;
begin
  select * into v_run from pgflow.runs as r where r.run_id = send_signal.run_id for update;
  if not found then
    raise exception 'Run % does not exist.', run_id using errcode = 'P0002';
  end if;
  select string_agg(format('"%s"', s.step_slug), ', ' order by s.step_index) into v_signal_steps
  from pgflow.steps as s where s.flow_slug = v_run.flow_slug and s.step_type = 'signal';
  select * into v_step from pgflow.steps as s
  where s.flow_slug = v_run.flow_slug and s.step_slug = send_signal.step_slug;
  v_signal_steps := case when v_signal_steps is null then 'The flow has no signal step.'
    else format('Its signal steps: %s (slugs are case-sensitive).', v_signal_steps) end;
  if not found then
    raise exception 'Flow "%" of run % has no signal step "%".', v_run.flow_slug, run_id, step_slug
      using errcode = 'P0002', hint = v_signal_steps;
  end if;
  if v_step.step_type <> 'signal' then
    raise exception 'Flow "%" of run % has no signal step "%".', v_run.flow_slug, run_id, step_slug
      using errcode = '22023', hint = v_signal_steps,
        detail = format('"%s" is a %s step: its tasks report its output.', step_slug, v_step.step_type);
  end if;
  if payload is null then
    raise exception 'The payload of a signal must not be SQL NULL.' using errcode = '22004',
      hint = 'Pass a JSON value; ''null''::jsonb is one.';
  end if;
  v_problem := pgflow.schema_violation(payload, v_step.payload_schema);
  if v_problem is not null then
    raise exception 'The payload does not match the schema of signal step "%" of flow "%".', step_slug, v_run.flow_slug
      using errcode = '22023', detail = v_problem, hint = 'Nothing was changed: send a payload that matches.';
  end if;
  if v_run.status <> 'started' then
    raise exception 'Run % is %, so it takes no signal.', run_id, v_run.status
      using errcode = '55000',
        hint = case when v_run.status = 'failed'
          then 'Nothing was changed. Retry the run (pgflow.retry_run), then send the signal.'
          else 'Nothing was changed.' end;
  end if;

  select * into v_signal from pgflow.signals as sg
  where sg.run_id = send_signal.run_id and sg.step_slug = send_signal.step_slug;
  if found then
    raise exception 'Step "%" of run % has its signal already (received at %).', step_slug, run_id,
      date_trunc('second', v_signal.received_at)
      using errcode = '23505', hint = 'A signal step takes one signal. Nothing was changed.';
  end if;
  select * into v_state from pgflow.step_states as ss
  where ss.run_id = send_signal.run_id and ss.step_slug = send_signal.step_slug
  for update;
  if v_state.status not in ('created', 'started') then
    raise exception 'Step "%" of run % is % already, so it takes no signal.', step_slug, run_id, v_state.status
      using errcode = '55000',
        detail = nullif(concat_ws(': ', v_state.skip_reason, v_state.error_message), ''),
        hint = 'Nothing was changed.';
  end if;
  -- GUARD: a wait that ran out takes no signal, even before a sweep has ended it.
  if v_state.status = 'started' and v_step.opt_timeout is not null
    and v_state.started_at + make_interval(secs => v_step.opt_timeout) <= clock_timestamp() then
    raise exception 'Step "%" of run % stopped waiting for its signal at %.', step_slug, run_id,
      date_trunc('second', v_state.started_at + make_interval(secs => v_step.opt_timeout))
      using errcode = '55000',
        detail = format('It waits %s s for its signal; the next stall-recovery sweep %s it.', v_step.opt_timeout,
          case when v_step.when_exhausted = 'fail' then 'fails' else 'skips' end),
        hint = 'Nothing was changed.';
  end if;

  insert into pgflow.signals (run_id, step_slug, payload, used_at)
  values (send_signal.run_id, send_signal.step_slug, send_signal.payload,
    case when v_state.status = 'started' then clock_timestamp() end)
  returning * into v_signal;
  perform pgflow._emit_event(run_id, 'signal:received', step_slug,
    case when v_state.status = 'started' then 'completed' else 'created' end);
  perform pgflow._record_action('signal', v_run.flow_slug, run_id, step_slug,
    jsonb_build_object('payload', payload));
  if v_state.status = 'started' then
    perform pgflow._complete_step(run_id, step_slug, payload);
    perform pgflow._advance_run(run_id);
  end if;
  return v_signal;
end;
$$;

-- Pauses a step of a flow: from now on no task of it starts, in any run and in either queue mode
-- (claims hold its messages, which use no attempt); tasks already started finish; the other steps
-- go on. Pausing a paused step keeps its paused_at and takes the new reason. Returns the pause.
-- A signal step runs no task and cannot be paused (engine 0011).
create or replace function pgflow.pause_step(flow_slug text, step_slug text, reason text default null)
returns pgflow.step_pauses
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_pause pgflow.step_pauses;
begin
  perform pgflow._require_step(flow_slug, step_slug);
  if exists (
    select 1 from pgflow.steps as s
    where s.flow_slug = pause_step.flow_slug and s.step_slug = pause_step.step_slug and s.step_type = 'signal'
  ) then
    raise exception 'Step "%" of flow "%" is a signal step: it runs no task, so there is nothing to pause.',
      step_slug, flow_slug
      using errcode = '22023', hint = 'Pause the steps that depend on it instead.';
  end if;
  insert into pgflow.step_pauses (flow_slug, step_slug, reason)
  values (pause_step.flow_slug, pause_step.step_slug, pause_step.reason)
  on conflict on constraint step_pauses_pkey do update set reason = excluded.reason
  returning * into v_pause;
  perform pgflow._record_action('pause', flow_slug, null, step_slug,
    case when reason is not null then jsonb_build_object('reason', reason) end);
  return v_pause;
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
  perform pgflow._record_action('resume', flow_slug, null, step_slug, null);
  return v_shown;
end;
$$;

-- Sets a step's limits, live, for every worker (engine 0017): at most max_in_flight of its tasks
-- started at once, and at most rate_limit task starts in any rate_period_s seconds (each attempt
-- and each map element counts). Null clears a limit; all null clears the step's limits. Messages
-- beyond a limit are not started, use no attempt, and are read again once there is room. A limit
-- set here stays until changed here, unless the flow's spec limits this step itself (applying its
-- migration sets the spec's). Returns the limits; null when cleared. A signal step runs no task and
-- takes no limit.
create or replace function pgflow.set_step_limits(
  flow_slug text,
  step_slug text,
  max_in_flight int default null,
  rate_limit int default null,
  rate_period_s int default null
)
returns pgflow.step_limits
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_limits pgflow.step_limits;
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
  v_limits := pgflow._put_step_limits(flow_slug, step_slug, max_in_flight, rate_limit, rate_period_s, 'operator');
  perform pgflow._record_action('limits', flow_slug, null, step_slug, jsonb_build_object(
    'max_in_flight', max_in_flight, 'rate_limit', rate_limit, 'rate_period_s', rate_period_s));
  return v_limits;
end;
$$;

-- Pauses a schedule (engine 0017): it starts no run until resumed; pausing a paused one keeps
-- its paused_at. Returns the schedule.
create or replace function pgflow.pause_schedule(flow_slug text, schedule_name text)
returns pgflow.schedules
language plpgsql
volatile
security definer
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
  perform pgflow._record_action('pause_schedule', flow_slug, null, null,
    jsonb_build_object('schedule', schedule_name));
  return v_schedule;
end;
$$;

-- Resumes a paused schedule (engine 0017): the slots of the pause are passed over, whatever its
-- catch-up, so its next slot after now starts the next run. Returns the schedule.
create or replace function pgflow.resume_schedule(flow_slug text, schedule_name text)
returns pgflow.schedules
language plpgsql
volatile
security definer
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
  perform pgflow._record_action('resume_schedule', flow_slug, null, null,
    jsonb_build_object('schedule', schedule_name));
  return v_schedule;
end;
$$;


-- Tasks engine 0007-0019 parked (requeued 3 times, their message archived, the task left started)
-- kept their runs started for ever. Each gets a new message and stays started with its requeued
-- count, so the next stall sweep gives up on it as on any task stalled a fourth time: its attempt
-- fails and the step's policy decides (a retry while attempts are left, else the run fails or the
-- step is skipped).
do $$
declare
  v_task record;
begin
  for v_task in
    select t.run_id, t.flow_slug, t.step_slug, t.task_index, t.queue_name
    from pgflow.step_tasks as t
    join pgflow.runs as r on r.run_id = t.run_id
    where t.status = 'started' and t.permanently_stalled_at is not null and r.status = 'started'
    order by t.run_id, t.step_slug, t.task_index
    for update of t
  loop
    update pgflow.step_tasks as t
    set permanently_stalled_at = null, message_id = (
      select pgmq.send(v_task.queue_name, jsonb_build_object('flow_slug', v_task.flow_slug,
        'run_id', v_task.run_id, 'step_slug', v_task.step_slug, 'task_index', v_task.task_index)))
    where t.run_id = v_task.run_id and t.step_slug = v_task.step_slug and t.task_index = v_task.task_index;
  end loop;
end;
$$;


-- A caller of engine 0017-0019's start_scheduled_runs could move a schedule's last slot past now
-- (even to infinity), which stopped it for good: such a slot goes back to now.
update pgflow.schedules set last_slot_at = now() where last_slot_at > now();


-- The engine writes the audit trail itself now (pgflow._record_action): no role but the owner
-- inserts into it any more (0019 let the client role insert any actor and time).
do $$
declare
  v_grantee text;
begin
  for v_grantee in
    select distinct case when a.grantee = 0 then 'public' else quote_ident(pg_get_userbyid(a.grantee)) end
    from pg_class as c
    cross join lateral aclexplode(c.relacl) as a
    where c.oid = 'pgflow.operator_actions'::regclass and a.privilege_type = 'INSERT'
      and a.grantee <> c.relowner
  loop
    execute format('revoke insert on pgflow.operator_actions from %s', v_grantee);
  end loop;
end;
$$;


-- No engine function runs for PUBLIC (engine 0019). The default privileges 0019 set per schema
-- cannot take away the EXECUTE PostgreSQL grants PUBLIC on every new function, so each migration
-- that creates one revokes it again.
revoke execute on all functions in schema pgflow from public;

-- Engine migration 0004: step state invariants, and one owner of the default-queue rule.
--
-- A started step knows how many tasks it has: `initial_tasks` is set before a step starts (a
-- single step has 1 from the start of the run; a map step learns its size from its array). The
-- engine never breaks this; the check makes it a guarantee, as pgflow has it. A database holding
-- a row that breaks it cannot be migrated: the migration fails and changes nothing.

alter table pgflow.step_states
  add constraint initial_tasks_is_known_when_started
  check (status <> 'started' or initial_tasks is not null);


-- The default-queue rule lower(flow_slug) gets one owner, pgflow.default_queue_name; the functions
-- that spelled it themselves call it now. Behaviour is unchanged.


-- The default queue of a flow: the one queue of a flow-mode flow, lower(flow_slug). The one place
-- in SQL that spells this rule (pgflow_gen.naming.default_queue_name is its Python twin); every
-- function that needs the default queue calls it. Pure.
create function pgflow.default_queue_name(flow_slug text)
returns text
language sql
immutable
parallel safe
set search_path = ''
return lower(flow_slug);

-- The one canonical queue resolver: the route of every step, in step order (step_index is the
-- zero-based position in step_slugs). Queue mode "flow" routes every step to its default queue;
-- "step" uses lower(flow__step) when it fits PGMQ's 47 characters, else lower(flow__<index>), else
-- rejects the flow. Names are never truncated or hashed. Pure: it raises (SQLSTATE 22023, with the
-- MESSAGE / DETAIL / HINT texts of pgflow_gen.naming) and writes nothing.
create or replace function pgflow.derive_queue_routes(flow_slug text, step_slugs text[], queue_mode text)
returns table (step_slug text, step_index int, queue_name text)
language plpgsql
stable
set search_path = ''
as $$
declare
  c_max constant int := 47;
  c_slug_hint constant text := 'Use 1-128 ASCII letters, digits and single underscores, starting with a letter and not ending with "_", for example "greetUser" or "greet_user".';
  v_slugs text[] := coalesce(step_slugs, '{}');
  v_count int := cardinality(coalesce(step_slugs, '{}'));
  v_violation text;
  v_step text;
  v_first int;
  v_readable text;
  v_fallback text;
  v_queue text;
  v_queues text[] := '{}';
begin
  if queue_mode is null or queue_mode not in ('flow', 'step') then
    raise exception 'Unknown queue mode "%" for flow "%".', queue_mode, flow_slug
      using errcode = '22023',
        hint = 'Use "flow" (one queue for the flow) or "step" (a private queue per step).';
  end if;
  v_violation := pgflow._slug_violation(flow_slug);
  if v_violation is not null then
    raise exception 'Invalid flow slug "%".', flow_slug
      using errcode = '22023', detail = format('The slug is invalid: %s.', v_violation), hint = c_slug_hint;
  end if;
  for i in 1 .. v_count loop
    v_step := v_slugs[i];
    v_violation := pgflow._slug_violation(v_step);
    if v_violation is not null then
      raise exception 'Invalid step slug "%" in flow "%".', v_step, flow_slug
        using errcode = '22023', detail = format('The slug is invalid: %s.', v_violation), hint = c_slug_hint;
    end if;
    v_first := (select min(j) from generate_subscripts(v_slugs, 1) as j where j < i and lower(v_slugs[j]) = lower(v_step));
    if v_first is not null then
      raise exception 'Step slug "%" duplicates "%" in flow "%".', v_step, v_slugs[v_first], flow_slug
        using errcode = '22023',
          detail = format('Step slugs must be unique ignoring case; steps %s and %s both normalize to "%s".',
            v_first - 1, i - 1, lower(v_step)),
          hint = 'Rename one of the steps.';
    end if;
  end loop;

  if queue_mode = 'flow' then
    v_queue := pgflow.default_queue_name(flow_slug);
    if length(v_queue) > c_max then
      raise exception 'Flow "%" cannot use its default queue.', flow_slug
        using errcode = '22023',
          detail = format('The queue "%s" is %s characters; PGMQ allows at most %s.', v_queue, length(v_queue), c_max),
          hint = 'Shorten the concrete flow slug.';
    end if;
    perform pgmq.validate_queue_name(v_queue);
    return query select s.slug, (s.ordinality - 1)::int, v_queue
      from unnest(v_slugs) with ordinality as s (slug, ordinality);
    return;
  end if;

  if v_count = 0 then
    raise exception 'Flow "%" has no steps, so it cannot use per-step queues.', flow_slug
      using errcode = '22023', hint = 'Add at least one step, or use the default single queue.';
  end if;
  v_fallback := lower(flow_slug || '__0');
  if length(v_fallback) > c_max then
    raise exception 'Flow "%" cannot use per-step queues.', flow_slug
      using errcode = '22023',
        detail = format('The shortest required queue "%s" is %s characters; PGMQ allows at most %s.',
          v_fallback, length(v_fallback), c_max),
        hint = 'Shorten the concrete flow slug or use the default single queue.';
  end if;
  for i in 1 .. v_count loop
    v_step := v_slugs[i];
    v_readable := lower(flow_slug || '__' || v_step);
    v_fallback := lower(flow_slug || '__' || (i - 1));
    if length(v_readable) <= c_max then
      v_queue := v_readable;
    elsif length(v_fallback) <= c_max then
      v_queue := v_fallback;
    else
      raise exception 'Cannot derive a queue for step "%" at index % in flow "%".', v_step, i - 1, flow_slug
        using errcode = '22023',
          detail = format('The readable name is %s characters and the index fallback is %s; PGMQ allows at most %s.',
            length(v_readable), length(v_fallback), c_max),
          hint = 'Shorten the concrete flow slug, shorten the step slug enough for the readable name, or use the default single queue.';
    end if;
    v_first := array_position(v_queues, v_queue);
    if v_first is not null then
      raise exception 'Steps "%" and "%" of flow "%" would share the queue "%".', v_slugs[v_first], v_step, flow_slug, v_queue
        using errcode = '22023',
          detail = 'Every step of a step-queued flow needs a queue of its own.',
          hint = 'Rename one of the steps.';
    end if;
    perform pgmq.validate_queue_name(v_queue);
    v_queues := v_queues || v_queue;
  end loop;
  return query select s.slug, (s.ordinality - 1)::int, s.name
    from unnest(v_slugs, v_queues) with ordinality as s (slug, name, ordinality);
end;
$$;

-- Checks, before any definition or queue is written, that flow_slug may own every queue in
-- queue_names: a name derived or referenced by another flow is rejected, and so is a queue PGMQ
-- already lists that this flow's current definition does not own (pgflow never adopts a queue),
-- or one listed under a different spelling. A flow reuses its own queues. Definition lock held.
create or replace function pgflow._preflight_queue_names(flow_slug text, queue_names text[])
returns void
language plpgsql
stable
set search_path = ''
as $$
declare
  v_queue text;
  v_other text;
  v_listed text[];
  v_owned boolean;
  v_all_listed text[] := array(select q.queue_name from pgmq.list_queues() as q);
begin
  foreach v_queue in array array(select distinct n from unnest(queue_names) as n order by n) loop
    perform pgmq.validate_queue_name(v_queue);

    select f.flow_slug into v_other
    from pgflow.flows as f
    where f.flow_slug <> _preflight_queue_names.flow_slug
      and ((f.queue_mode = 'flow' and pgflow.default_queue_name(f.flow_slug) = v_queue)
        or exists (select 1 from pgflow.steps as s where s.flow_slug = f.flow_slug and s.queue_name = v_queue))
    order by f.flow_slug
    limit 1;
    if v_other is not null then
      raise exception 'Flow "%" cannot use the queue "%": flow "%" already uses it.', flow_slug, v_queue, v_other
        using errcode = '42710',
          detail = 'Every pgflow queue belongs to exactly one concrete flow.',
          hint = 'Rename one of the flows.';
    end if;

    v_listed := array(select l from unnest(v_all_listed) as l where lower(l) = v_queue order by l);
    continue when cardinality(v_listed) = 0;
    v_owned := exists (
      select 1 from pgflow.flows as f
      where f.flow_slug = _preflight_queue_names.flow_slug
        and ((f.queue_mode = 'flow' and pgflow.default_queue_name(f.flow_slug) = v_queue)
          or exists (select 1 from pgflow.steps as s where s.flow_slug = f.flow_slug and s.queue_name = v_queue))
    );
    if not v_owned then
      raise exception 'Flow "%" cannot use the queue "%": a queue of that name already exists.', flow_slug, v_queue
        using errcode = '42710',
          detail = format('PGMQ lists %s, which no pgflow definition owns; pgflow never adopts a queue it did not create.',
            array_to_string(v_listed, ', ')),
          hint = 'Drop or rename the existing queue (pgmq.drop_queue), or rename the flow.';
    end if;
    if v_listed <> array[v_queue] then
      raise exception 'The queue "%" of flow "%" is ambiguous.', v_queue, flow_slug
        using errcode = '42710',
          detail = format('PGMQ lists %s for it; PGMQ names the tables in lowercase, so these spellings are one physical queue.',
            array_to_string(v_listed, ', ')),
          hint = 'Remove the extra spellings'' rows from pgmq.meta (never pgmq.drop_queue, which drops the shared tables).';
    end if;
  end loop;
end;
$$;

-- Defines a flow-mode flow and creates its default queue. Idempotent: an existing flow is
-- returned as it is, and different options for it are an error, never a silent change. A slug
-- differing only in case from an existing flow, an existing step-queued flow, or a queue pgflow
-- does not own is rejected.
-- Takes the flow's definition lock.
create or replace function pgflow.create_flow(
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
  v_queue text := pgflow.default_queue_name(flow_slug);
begin
  -- GUARD: the slug rules and the default queue's length, with the resolver's errors.
  perform from pgflow.derive_queue_routes(flow_slug, '{}', 'flow');

  perform pgflow._lock_flow_definition(flow_slug);

  select * into v_flow from pgflow.flows as f where lower(f.flow_slug) = lower(create_flow.flow_slug);
  if found and v_flow.flow_slug <> create_flow.flow_slug then
    raise exception 'Flow "%" differs only in case from the existing flow "%".', flow_slug, v_flow.flow_slug
      using errcode = '23505',
        detail = 'Flow slugs are unique ignoring case.',
        hint = 'Use the existing spelling, or a different flow slug.';
  end if;
  if found and v_flow.queue_mode <> 'flow' then
    raise exception 'Flow "%" uses per-step queues; create_flow defines flow-mode flows only.', flow_slug
      using errcode = '55000',
        hint = 'A step-queued flow is defined as a whole by pgflow.ensure_flow_compiled().';
  end if;
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

  perform pgflow._preflight_queue_names(flow_slug, array[v_queue]);
  v_flow := pgflow._insert_flow(flow_slug, 'flow', max_attempts, base_delay, timeout);
  perform pgmq.create(v_queue);
  return v_flow;
end;
$$;

-- Appends a step to a flow-mode flow (its step_index is the next one, its route the flow's
-- default queue) with its dependency edges. Idempotent: re-adding an identical step returns it;
-- any difference is an error. Step-queued flows are refused: they are defined only as a whole, by
-- ensure_flow_compiled. Takes the flow's definition lock.
create or replace function pgflow.add_step(
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
  v_mode text;
begin
  perform pgflow._lock_flow_definition(flow_slug);

  select f.queue_mode into v_mode from pgflow.flows as f where f.flow_slug = add_step.flow_slug;
  if not found then
    raise exception 'Flow "%" does not exist.', flow_slug
      using errcode = 'P0002', hint = 'Create it first with pgflow.create_flow().';
  end if;
  if v_mode = 'step' then
    raise exception 'Flow "%" uses per-step queues, so add_step cannot extend it.', flow_slug
      using errcode = '55000',
        detail = 'A step-queued flow is defined as a whole, with its complete routes, by pgflow.ensure_flow_compiled().',
        hint = 'Compile the complete flow (its generated migration or a worker does this), or use a new flow slug.';
  end if;

  return pgflow._insert_step(
    flow_slug, step_slug, deps_slugs, max_attempts, base_delay, timeout, start_delay, step_type,
    required_input_pattern, forbidden_input_pattern, when_unmet, when_exhausted,
    pgflow.default_queue_name(flow_slug)
  );
end;
$$;

-- Deletes a flow's definition and all its runtime data (archiving its unfinished tasks' messages),
-- and drops the queues its queue mode owns: the steps' routes, plus the default queue in flow mode
-- only (a step-queued flow never touches an unrelated queue of that name). A queue is dropped
-- under the spelling PGMQ lists for it (two spellings are refused as ambiguous), and kept while
-- another flow still routes to it.
-- Takes the flow's definition lock, then its runs' row locks; does nothing for an unknown flow.
create or replace function pgflow.delete_flow_and_data(flow_slug text)
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
  v_mode text;
  v_listed text[];
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

-- Startup compilation: creates a missing flow from its shape in its queue mode, verifies an
-- existing one (shape, then queue mode and the persisted route of every step), and on a
-- difference recompiles only in a local database (pgflow.local = on), else reports a mismatch of
-- kind "shape" or "routing" and changes nothing. The engine derives the routes itself: a supplied
-- route_map ([{stepSlug, queueName}] in step order) must be exactly the derived one (required in
-- step mode). Takes the flow's definition lock; any failure rolls back everything.
create or replace function pgflow.ensure_flow_compiled(
  flow_slug text,
  shape jsonb,
  queue_mode text default 'flow',
  route_map jsonb default null
)
returns jsonb
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_step_slugs text[];
  v_queues text[];
  v_derived jsonb;
  v_persisted jsonb;
  v_mode text;
  v_twin text;
  v_differences text[] := '{}';
  v_routing text[] := '{}';
  v_kind text;
begin
  perform pgflow._validate_flow_shape(shape);
  v_step_slugs := array(select s.value ->> 'slug' from jsonb_array_elements(shape -> 'steps') as s);
  select coalesce(array_agg(r.queue_name order by r.step_index), '{}'),
    coalesce(jsonb_agg(jsonb_build_object('stepSlug', r.step_slug, 'queueName', r.queue_name) order by r.step_index), '[]')
  into v_queues, v_derived
  from pgflow.derive_queue_routes(flow_slug, v_step_slugs, queue_mode) as r;
  perform pgflow._check_route_map(flow_slug, queue_mode, v_derived, route_map);

  perform pgflow._lock_flow_definition(flow_slug);

  select f.flow_slug into v_twin from pgflow.flows as f
  where lower(f.flow_slug) = lower(ensure_flow_compiled.flow_slug) and f.flow_slug <> ensure_flow_compiled.flow_slug;
  if v_twin is not null then
    raise exception 'Flow "%" differs only in case from the existing flow "%".', flow_slug, v_twin
      using errcode = '23505', detail = 'Flow slugs are unique ignoring case.',
        hint = 'Use the existing spelling, or a different flow slug.';
  end if;

  select f.queue_mode into v_mode from pgflow.flows as f where f.flow_slug = ensure_flow_compiled.flow_slug;
  if not found then
    perform pgflow._create_flow_from_shape(flow_slug, shape, queue_mode, v_queues);
    return jsonb_build_object('status', 'compiled', 'mismatchKind', null, 'differences', '[]'::jsonb);
  end if;

  v_differences := pgflow._compare_flow_shapes(
    pgflow._normalize_flow_shape(shape), pgflow._get_flow_shape(flow_slug)
  );
  if v_mode <> queue_mode then
    v_routing := v_routing || format('Queue mode of flow "%s" differs: expected "%s", persisted "%s"',
      flow_slug, queue_mode, v_mode);
  end if;
  -- Routes are compared even when shape and mode match (a changed resolver or a manual edit); with
  -- a different shape the steps do not line up, and the shape differences say enough.
  v_persisted := pgflow._get_queue_routes(flow_slug);
  if cardinality(v_differences) = 0 and v_persisted <> v_derived then
    v_routing := v_routing || array(
      select format('Route of step "%s" of flow "%s" differs: expected queue "%s", persisted "%s"',
        e.value ->> 'stepSlug', flow_slug, e.value ->> 'queueName', v_persisted -> (e.ordinality - 1)::int ->> 'queueName')
      from jsonb_array_elements(v_derived) with ordinality as e
      where e.value <> v_persisted -> (e.ordinality - 1)::int
      order by e.ordinality
    );
  end if;
  if cardinality(v_differences) = 0 and cardinality(v_routing) = 0 then
    return jsonb_build_object('status', 'verified', 'mismatchKind', null, 'differences', '[]'::jsonb);
  end if;
  v_kind := case when cardinality(v_differences) > 0 then 'shape' else 'routing' end;
  v_differences := v_differences || v_routing;

  if coalesce(current_setting('pgflow.local', true), '') = 'on' then
    -- The new queues must be free before the old definition goes (its own queues count as free).
    perform pgflow._preflight_queue_names(flow_slug,
      case when queue_mode = 'flow' then array[pgflow.default_queue_name(flow_slug)] else v_queues end);
    perform pgflow.delete_flow_and_data(flow_slug);
    perform pgflow._create_flow_from_shape(flow_slug, shape, queue_mode, v_queues);
    return jsonb_build_object('status', 'recompiled', 'mismatchKind', v_kind,
      'differences', to_jsonb(v_differences));
  end if;
  return jsonb_build_object('status', 'mismatch', 'mismatchKind', v_kind,
    'differences', to_jsonb(v_differences));
end;
$$;

-- Maintenance: deletes finished runs (completed or failed before now - retention) with their step
-- states and tasks, workers silent for longer than retention, and archived messages older than
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
    select s.queue_name from pgflow.steps as s
    union
    select pgflow.default_queue_name(f.flow_slug) from pgflow.flows as f where f.queue_mode = 'flow'
  loop
    continue when to_regclass(format('pgmq.%I', 'a_' || v_queue)) is null;
    execute format('delete from pgmq.%I where archived_at < $1', 'a_' || v_queue) using v_cutoff;
    get diagnostics v_count = row_count;
    v_archived := v_archived + v_count;
  end loop;

  return jsonb_build_object(
    'runs', coalesce(cardinality(v_runs), 0), 'workers', v_workers, 'archived_messages', v_archived
  );
end;
$$;

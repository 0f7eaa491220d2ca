-- Engine migration 0002: private per-step queues.
--
-- Adds flows.queue_mode (every existing flow becomes "flow"), the stricter slug rules (starts with
-- a letter, no trailing "_", no "__", flow slugs unique ignoring case, step slugs unique ignoring
-- case within a flow), the route resolver pgflow.derive_queue_routes, compilation with queue
-- mode and route map, exact step claims, mode-aware deletion and pruning, and queue_coverage.
-- Every persisted definition is checked first: a violation aborts the whole migration with a list
-- of them, and nothing is renamed or deleted. Queues, task queue snapshots, message ids and
-- queued messages are left exactly as they are.

-- Why a flow or step slug breaks the slug rules, or NULL when it is valid: 1-128 characters,
-- ASCII letters, digits and "_", starting with a letter, not ending with "_", no "__" (reserved as
-- the separator of generated queue names), not the reserved word "run". The texts match
-- pgflow_gen.naming.slug_violation word for word.
create function pgflow._slug_violation(slug text)
returns text
language sql
immutable
set search_path = ''
as $$
  select case
    when slug is null then 'it is missing'
    when slug = '' then 'it is empty'
    when length(slug) > 128 then format('it has %s characters; at most 128 are allowed', length(slug))
    when slug !~ '^[A-Za-z0-9_]+$' then 'only ASCII letters, digits and underscores are allowed'
    when slug !~ '^[A-Za-z]' then 'it must start with a letter'
    when slug ~ '_$' then 'it must not end with an underscore'
    when strpos(slug, '__') > 0 then '"__" is reserved as the separator of generated queue names'
    when slug = 'run' then '"run" is a reserved word'
  end
$$;

-- Every persisted definition, used or not, must follow the new rules before anything changes;
-- the lock keeps version-1 writers from slipping a definition in between check and constraint.
lock table pgflow.flows, pgflow.steps in share row exclusive mode;

do $migration$
declare
  v_violations text[];
begin
  select array_agg(v.line order by v.line) into v_violations
  from (
    select format('flow "%s": %s', f.flow_slug, pgflow._slug_violation(f.flow_slug)) as line
    from pgflow.flows as f
    where pgflow._slug_violation(f.flow_slug) is not null
    union all
    select format('flow "%s", step "%s": %s', s.flow_slug, s.step_slug, pgflow._slug_violation(s.step_slug))
    from pgflow.steps as s
    where pgflow._slug_violation(s.step_slug) is not null
    union all
    select format('flow "%s": differs only in case from flow "%s" (flow slugs must be unique ignoring case)',
      f.flow_slug, g.flow_slug)
    from pgflow.flows as f
    join pgflow.flows as g on lower(g.flow_slug) = lower(f.flow_slug) and g.flow_slug < f.flow_slug
    union all
    select format('flow "%s", step "%s": differs only in case from step "%s" (step slugs must be unique ignoring case)',
      s.flow_slug, s.step_slug, t.step_slug)
    from pgflow.steps as s
    join pgflow.steps as t
      on t.flow_slug = s.flow_slug and lower(t.step_slug) = lower(s.step_slug) and t.step_slug < s.step_slug
  ) as v;
  if v_violations is not null then
    raise exception 'Engine migration 0002 cannot upgrade: % persisted definitions break the new naming rules.',
      cardinality(v_violations)
      using errcode = '23514',
        detail = array_to_string(v_violations, E'\n'),
        hint = 'Nothing was changed. With version 1 still installed, delete these flows with pgflow.delete_flow_and_data() or recreate them under compliant slugs, then migrate again (docs/naming.md).';
  end if;
end
$migration$;

alter table pgflow.flows add column queue_mode text not null default 'flow';
alter table pgflow.flows add constraint queue_mode_is_known check (queue_mode in ('flow', 'step'));
create unique index flows_flow_slug_lower_idx on pgflow.flows (lower(flow_slug));
create unique index steps_flow_slug_lower_step_slug_idx on pgflow.steps (flow_slug, lower(step_slug));

-- Replaced by versions with new signatures below.
drop function pgflow.ensure_flow_compiled(text, jsonb);
drop function pgflow._create_flow_from_shape(text, jsonb);
drop function pgflow.start_tasks(text, bigint[], uuid, text);

-- The slug rule (from engine version 2): whether pgflow._slug_violation finds nothing wrong.
-- Used by the check constraints of flows and steps and by every definition writer.
create or replace function pgflow.is_valid_slug(slug text)
returns boolean
language sql
immutable
set search_path = ''
as $$
  select pgflow._slug_violation(slug) is null
$$;

-- The one canonical queue resolver: the route of every step, in step order (step_index is the
-- zero-based position in step_slugs). Queue mode "flow" routes every step to lower(flow_slug);
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
    v_queue := lower(flow_slug);
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
      and ((f.queue_mode = 'flow' and lower(f.flow_slug) = v_queue)
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
        and ((f.queue_mode = 'flow' and lower(f.flow_slug) = v_queue)
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

-- Writes one flow row in the given queue mode after checking its options; no queue is created.
-- Used by create_flow and by the compilation of step-queued flows, under the definition lock.
create or replace function pgflow._insert_flow(
  flow_slug text,
  queue_mode text,
  max_attempts int,
  base_delay int,
  timeout int
)
returns pgflow.flows
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_flow pgflow.flows;
begin
  if max_attempts < 1 or base_delay < 0 or timeout < 1 then
    raise exception 'Invalid options for flow "%".', flow_slug
      using errcode = '22023',
        detail = format('max_attempts=%s, base_delay=%s, timeout=%s', max_attempts, base_delay, timeout),
        hint = 'max_attempts must be at least 1, base_delay at least 0 and timeout at least 1.';
  end if;
  insert into pgflow.flows (flow_slug, queue_mode, opt_max_attempts, opt_base_delay, opt_timeout)
  values (flow_slug, queue_mode, coalesce(max_attempts, 3), coalesce(base_delay, 5), coalesce(timeout, 60))
  returning * into v_flow;
  return v_flow;
end;
$$;

-- Defines a flow-mode flow and creates its queue lower(flow_slug). Idempotent: an existing flow is
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
  v_queue text := lower(flow_slug);
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

-- Appends a step to a flow-mode flow (its step_index is the next one, its route the flow's queue
-- lower(flow_slug)) with its dependency edges. Idempotent: re-adding an identical step returns it;
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
    required_input_pattern, forbidden_input_pattern, when_unmet, when_exhausted, lower(flow_slug)
  );
end;
$$;

-- Writes a complete flow definition from a shape in the given queue mode: the flow with
-- shape.options, every step in array order with its options and its route from queue_names (in
-- step order), then the queues. Every queue name is checked before anything is written (in flow
-- mode by create_flow). Called by ensure_flow_compiled under the definition lock, for a flow that
-- does not exist.
create or replace function pgflow._create_flow_from_shape(flow_slug text, shape jsonb, queue_mode text, queue_names text[])
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_options jsonb := coalesce(shape -> 'options', '{}');
  v_step jsonb;
  v_index bigint;
  v_step_options jsonb;
  v_queue text;
begin
  if queue_mode = 'flow' then
    perform pgflow.create_flow(
      flow_slug, (v_options ->> 'maxAttempts')::int, (v_options ->> 'baseDelay')::int,
      (v_options ->> 'timeout')::int
    );
  else
    perform pgflow._preflight_queue_names(flow_slug, queue_names);
    perform pgflow._insert_flow(
      flow_slug, 'step', (v_options ->> 'maxAttempts')::int, (v_options ->> 'baseDelay')::int,
      (v_options ->> 'timeout')::int
    );
  end if;

  for v_step, v_index in select s.value, s.ordinality from jsonb_array_elements(shape -> 'steps') with ordinality as s loop
    v_step_options := coalesce(v_step -> 'options', '{}');
    perform pgflow._insert_step(
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
      coalesce(v_step ->> 'whenExhausted', 'fail'),
      queue_names[v_index]
    );
  end loop;

  if queue_mode = 'step' then
    foreach v_queue in array queue_names loop
      perform pgmq.create(v_queue);
    end loop;
  end if;
end;
$$;

-- Deletes a flow's definition and all its runtime data (archiving its unfinished tasks' messages),
-- and drops the queues its queue mode owns: the steps' routes, plus lower(flow_slug) in flow mode
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
    select lower(delete_flow_and_data.flow_slug) where v_mode = 'flow'
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
      or exists (select 1 from pgflow.flows as f where f.queue_mode = 'flow' and lower(f.flow_slug) = v_queue);
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
      case when queue_mode = 'flow' then array[lower(flow_slug)] else v_queues end);
    perform pgflow.delete_flow_and_data(flow_slug);
    perform pgflow._create_flow_from_shape(flow_slug, shape, queue_mode, v_queues);
    return jsonb_build_object('status', 'recompiled', 'mismatchKind', v_kind,
      'differences', to_jsonb(v_differences));
  end if;
  return jsonb_build_object('status', 'mismatch', 'mismatchKind', v_kind,
    'differences', to_jsonb(v_differences));
end;
$$;

-- Appends a step routed to queue_name (its step_index is the next one) with its dependency edges,
-- after checking it. Idempotent: re-adding an identical step returns it, any difference is an
-- error, and a persisted route is never changed. The caller holds the definition lock and has
-- checked that the flow exists. Used by add_step and by the compilation of step-queued flows.
create or replace function pgflow._insert_step(
  flow_slug text,
  step_slug text,
  deps_slugs text[],
  max_attempts int,
  base_delay int,
  timeout int,
  start_delay int,
  step_type text,
  required_input_pattern jsonb,
  forbidden_input_pattern jsonb,
  when_unmet text,
  when_exhausted text,
  queue_name text
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
  v_violation text := pgflow._slug_violation(step_slug);
  v_twin text;
begin
  -- GUARD: validate everything before touching any row.
  if v_violation is not null then
    raise exception 'Invalid step slug "%" in flow "%".', step_slug, flow_slug
      using errcode = '22023', detail = format('The slug is invalid: %s.', v_violation),
        hint = 'Use 1-128 ASCII letters, digits and single underscores, starting with a letter and not ending with "_", for example "greetUser" or "greet_user".';
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

  select d into v_unknown
  from unnest(v_deps) as d
  where not exists (
    select 1 from pgflow.steps as s where s.flow_slug = _insert_step.flow_slug and s.step_slug = d
  )
  limit 1;
  if v_unknown is not null then
    raise exception 'Step "%" depends on unknown step "%" in flow "%".', step_slug, v_unknown, flow_slug
      using errcode = '22023',
        hint = 'Add steps in dependency order: a dependency must be added before the steps that use it.';
  end if;

  -- GUARD: an existing step is returned only when identical; definitions never change silently.
  select * into v_step from pgflow.steps as s
  where s.flow_slug = _insert_step.flow_slug and s.step_slug = _insert_step.step_slug;
  if found then
    select coalesce(array_agg(d.dep_slug order by d.dep_slug), '{}') into v_existing_deps
    from pgflow.deps as d where d.flow_slug = _insert_step.flow_slug and d.step_slug = _insert_step.step_slug;
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
  select s.step_slug into v_twin from pgflow.steps as s
  where s.flow_slug = _insert_step.flow_slug and lower(s.step_slug) = lower(_insert_step.step_slug);
  if v_twin is not null then
    raise exception 'Step slug "%" duplicates "%" in flow "%".', step_slug, v_twin, flow_slug
      using errcode = '23505', detail = 'Step slugs are unique ignoring case within a flow.',
        hint = 'Rename the step.';
  end if;

  insert into pgflow.steps (
    flow_slug, step_slug, step_index, step_type, deps_count, queue_name,
    opt_max_attempts, opt_base_delay, opt_timeout, opt_start_delay,
    required_input_pattern, forbidden_input_pattern, when_unmet, when_exhausted
  )
  select _insert_step.flow_slug, _insert_step.step_slug,
    coalesce((select max(s.step_index) + 1 from pgflow.steps as s where s.flow_slug = _insert_step.flow_slug), 0),
    _insert_step.step_type, cardinality(v_deps), _insert_step.queue_name,
    max_attempts, base_delay, timeout, start_delay,
    required_input_pattern, forbidden_input_pattern, when_unmet, when_exhausted
  returning * into v_step;

  insert into pgflow.deps (flow_slug, dep_slug, step_slug)
  select _insert_step.flow_slug, d, _insert_step.step_slug from unnest(v_deps) as d;

  return v_step;
end;
$$;

-- The persisted route map of a flow, [{stepSlug, queueName}] in step order: the format workers
-- send to ensure_flow_compiled, so the two compare directly.
create or replace function pgflow._get_queue_routes(flow_slug text)
returns jsonb
language sql
stable
set search_path = ''
as $$
  select coalesce(jsonb_agg(
    jsonb_build_object('stepSlug', s.step_slug, 'queueName', s.queue_name) order by s.step_index
  ), '[]'::jsonb)
  from pgflow.steps as s
  where s.flow_slug = _get_queue_routes.flow_slug
$$;

-- Rejects a caller's route map that is not exactly the routes the engine derived (complete, in
-- step order, no extra or duplicate entries, nothing else in an entry), listing the differences.
-- A step-queued flow must send its map; a flow-mode caller may omit it.
create or replace function pgflow._check_route_map(flow_slug text, queue_mode text, derived jsonb, route_map jsonb)
returns void
language plpgsql
immutable
set search_path = ''
as $$
declare
  v_differences text[] := '{}';
  v_expected jsonb;
  v_actual jsonb;
begin
  if route_map is null then
    if queue_mode = 'step' then
      raise exception 'The route map of step-queued flow "%" is missing.', flow_slug
        using errcode = '22023',
          detail = 'A step-queued flow is compiled with its complete route map.',
          hint = format('Send the routes the engine derives: %s', derived);
    end if;
    return;
  end if;
  if jsonb_typeof(route_map) <> 'array' then
    raise exception 'The route map of flow "%" must be a JSON array.', flow_slug
      using errcode = '22023', detail = left(route_map::text, 200),
        hint = format('Send the routes the engine derives: %s', derived);
  end if;
  if route_map = derived then
    return;
  end if;
  for i in 0 .. greatest(jsonb_array_length(derived), jsonb_array_length(route_map)) - 1 loop
    v_expected := derived -> i;
    v_actual := route_map -> i;
    if v_actual is null then
      v_differences := v_differences || format('entry %s is missing: expected %s', i, v_expected);
    elsif v_expected is null then
      v_differences := v_differences || format('entry %s is extra: %s', i, v_actual);
    elsif v_actual <> v_expected then
      v_differences := v_differences || format('entry %s: expected %s, got %s', i, v_expected, v_actual);
    end if;
  end loop;
  raise exception 'The route map of flow "%" does not match the routes the engine derives.', flow_slug
    using errcode = '22023', detail = array_to_string(v_differences, E'\n'),
      hint = 'Regenerate the flow with the pgflow-gen version that matches the engine.';
end;
$$;

-- Phase two of a claim: of the messages a worker read from queue_name, claims the queued tasks of
-- this flow whose run and step are started, extends each message's visibility to the step's
-- timeout + 2 s, and returns the tasks with their inputs. Task rows locked by someone else are
-- skipped (their message comes back later), so a claim never waits; then PGMQ rows are locked.
-- First it archives the queue's batch of completed tasks' messages.
-- The selector follows the flow's queue mode: a step-queued flow claims only tasks of step_slug,
-- which must name a step exactly and queue_name its exact route; a flow-mode flow takes no step.
-- A wrong selector raises before anything changes.
create or replace function pgflow.start_tasks(
  flow_slug text,
  msg_ids bigint[],
  worker_id uuid,
  queue_name text,
  step_slug text default null
)
returns setof pgflow.step_task_record
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
  v_offsets int[];
  v_visible_set int;
begin
  if queue_name is null then
    raise exception 'start_tasks needs the queue the messages were read from.' using errcode = '22004';
  end if;
  select f.queue_mode into v_mode from pgflow.flows as f where f.flow_slug = start_tasks.flow_slug;
  if not found then
    raise exception 'Flow "%" does not exist.', flow_slug using errcode = 'P0002';
  end if;
  if v_mode = 'flow' and step_slug is not null then
    raise exception 'Flow "%" uses its default queue, so start_tasks takes no step slug.', flow_slug
      using errcode = '22023', hint = 'Call start_tasks without step_slug for a flow-mode flow.';
  end if;
  if v_mode = 'step' then
    if step_slug is null then
      raise exception 'Flow "%" uses per-step queues, so start_tasks needs the step slug.', flow_slug
        using errcode = '22023', hint = 'Pass step_slug => the step this worker runs, with that step''s queue.';
    end if;
    select s.queue_name into v_route from pgflow.steps as s
    where s.flow_slug = start_tasks.flow_slug and s.step_slug = start_tasks.step_slug;
    if not found then
      select s.step_slug into v_twin from pgflow.steps as s
      where s.flow_slug = start_tasks.flow_slug and lower(s.step_slug) = lower(start_tasks.step_slug);
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
      and (start_tasks.step_slug is null or t.step_slug = start_tasks.step_slug)
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

-- Maintenance: deletes finished runs (completed or failed before now - retention) with their step
-- states and tasks, workers silent for longer than retention, and archived messages older than
-- retention in every queue a flow owns (its steps' routes, plus lower(flow_slug) for a flow-mode
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
    select lower(f.flow_slug) from pgflow.flows as f where f.queue_mode = 'flow'
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

-- Which queue routes have a live worker right now: every persisted step route, left-joined to the
-- workers registered on exactly that queue that are neither stopped nor deprecated and sent a
-- heartbeat within `freshness` (workers beat every 5 s; the default spans three beats).
-- Several live instances are one covered route. A point-in-time check, run after a deployment.
create or replace function pgflow.queue_coverage(freshness interval default '15 seconds')
returns table (
  flow_slug text,
  step_slug text,
  step_index int,
  queue_name text,
  live_workers int,
  covered boolean
)
language sql
stable
set search_path = ''
as $$
  select s.flow_slug, s.step_slug, s.step_index, s.queue_name,
    count(w.worker_id)::int, count(w.worker_id) > 0
  from pgflow.steps as s
  left join pgflow.workers as w
    on w.queue_name = s.queue_name
    and w.stopped_at is null
    and w.deprecated_at is null
    and w.last_heartbeat_at > now() - queue_coverage.freshness
  group by s.flow_slug, s.step_slug, s.step_index, s.queue_name
  order by s.flow_slug, s.step_index
$$;

-- Engine migration 0028: subflows.
--
-- A step can start runs of another flow (issue 37): step_type 'subflow' (one child run) or a map
-- with a subflow_slug (one child run per element). Its tasks have no message and no worker: when
-- the step is ready the engine starts the child runs in the same transaction; a child's
-- completion completes its task in the transaction that completed the child, its failure fails
-- the task's attempt (retried in place: pgflow._retry_run resumes the child where it failed),
-- its cancellation fails the task for good. A run's failure fails its running children, its
-- cancellation cancels them; retry_run of a parent resumes its failed children; pruning takes a
-- run with its subflow runs; subflows nest at most 8 deep. New columns: steps.subflow_slug,
-- runs.parent_run_id, parent_step_slug, parent_task_index. start_flows, retry_run and cancel_run
-- keep their signatures and move their bodies to _start_runs, _retry_run and _cancel_run, which
-- subflows share; add_step gains subflow_slug (so it is dropped and created again).

-- BEGIN HAND-WRITTEN: tables and data, applied before the functions below.
alter table pgflow.steps add column subflow_slug text;
alter table pgflow.steps drop constraint step_type_is_known;
alter table pgflow.steps add constraint step_type_is_known
  check (step_type in ('single', 'map', 'signal', 'subflow'));
alter table pgflow.steps add constraint subflow_step_has_at_most_one_dependency
  check (step_type <> 'subflow' or deps_count <= 1);
alter table pgflow.steps add constraint subflow_slug_is_on_subflow_steps check (
  case step_type when 'subflow' then subflow_slug is not null when 'map' then true else subflow_slug is null end
);

alter table pgflow.runs
  add column parent_run_id uuid,
  add column parent_step_slug text,
  add column parent_task_index int,
  add constraint parent_is_whole check (
    (parent_run_id is null) = (parent_step_slug is null) and (parent_run_id is null) = (parent_task_index is null)
  );
create index runs_parent_idx on pgflow.runs (parent_run_id, parent_step_slug, parent_task_index)
  where parent_run_id is not null;
-- END HAND-WRITTEN

-- Written by `make migration` from pgflow_gen/runtime/sql/source/: edit the source, then
-- write the migration again; only the header and the hand-written section above are kept.

-- pgflow._insert_step: gone from the source
drop function pgflow._insert_step(text,text,text[],integer,integer,integer,integer,text,jsonb,jsonb,text,text,text);

-- pgflow.add_step: gone from the source
drop function pgflow.add_step(text,text,text[],integer,integer,integer,integer,text,jsonb,jsonb,text,text);

-- pgflow.add_step: source/0111_function_add_step.sql
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
  when_exhausted text default 'fail',
  subflow_slug text default null
)
returns pgflow.steps
language plpgsql
volatile
security definer
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
    pgflow.default_queue_name(flow_slug), subflow_slug
  );
end;
$$;

-- pgflow._get_flow_shape: source/0112_function_get_flow_shape.sql
create or replace function pgflow._get_flow_shape(flow_slug text)
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
    ) || case when s.subflow_slug is not null then jsonb_build_object('subflowSlug', s.subflow_slug)
      else '{}'::jsonb end
    order by s.step_index
  ), '[]'::jsonb))
  from pgflow.steps as s
  where s.flow_slug = _get_flow_shape.flow_slug
$$;

-- pgflow._compare_flow_shapes: source/0113_function_compare_flow_shapes.sql
create or replace function pgflow._compare_flow_shapes(expected jsonb, actual jsonb)
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
    foreach v_key in array array['whenUnmet', 'whenExhausted', 'requiredInputPattern', 'forbiddenInputPattern',
      'subflowSlug'] loop
      if v_e -> v_key is distinct from v_a -> v_key then
        v_differences := v_differences || format('Step at index %s: %s differs %s vs %s', i, v_key, v_e -> v_key, v_a -> v_key);
      end if;
    end loop;
  end loop;
  return v_differences;
end;
$$;

-- pgflow._create_flow_from_shape: source/0114_function_create_flow_from_shape.sql
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
      queue_names[v_index],
      v_step ->> 'subflowSlug'
    );
  end loop;

  if queue_mode = 'step' then
    -- A signal or subflow step runs no task in a worker: its route is reserved, but it has no queue.
    for v_queue in
      select s.queue_name from pgflow.steps as s
      where s.flow_slug = _create_flow_from_shape.flow_slug and s.step_type <> 'signal'
        and s.subflow_slug is null
      order by s.step_index
    loop
      perform pgmq.create(v_queue);
    end loop;
  end if;
end;
$$;

-- pgflow._validate_flow_shape: source/0115_function_validate_flow_shape.sql
create or replace function pgflow._validate_flow_shape(shape jsonb)
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
    if v_step ? 'payloadSchema' and (jsonb_typeof(v_step -> 'payloadSchema') is distinct from 'object'
      or v_step ->> 'stepType' is distinct from 'signal') then
      raise exception 'Invalid flow shape: "payloadSchema" of step "%" must be a JSON Schema object of a signal step.',
        v_step ->> 'slug'
        using errcode = '22023';
    end if;
    if v_step ? 'subflowSlug' and (jsonb_typeof(v_step -> 'subflowSlug') is distinct from 'string'
      or coalesce(v_step ->> 'stepType', 'single') not in ('subflow', 'map')) then
      raise exception 'Invalid flow shape: "subflowSlug" of step "%" must be the slug of a flow, on a subflow or map step.',
        v_step ->> 'slug'
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

  if shape ? 'inputSchema' and jsonb_typeof(shape -> 'inputSchema') is distinct from 'object' then
    raise exception 'Invalid flow shape: "inputSchema" must be a JSON Schema object, got %.',
      jsonb_typeof(shape -> 'inputSchema')
      using errcode = '22023';
  end if;

  -- Options must be whole numbers (flow options, then each step's), but for a step's
  -- concurrency key, a JSON path (engine 0018).
  for v_option in
    select o.key, o.value from jsonb_each(coalesce(shape -> 'options', '{}')) as o
    union all
    select o.key, o.value
    from jsonb_array_elements(shape -> 'steps') as s, jsonb_each(coalesce(s.value -> 'options', '{}')) as o
  loop
    if v_option.key = 'concurrencyKey' and jsonb_typeof(v_option.value) = 'string' then
      begin
        perform (v_option.value #>> '{}')::jsonpath;
      exception when syntax_error then
        raise exception 'Invalid flow shape: option "concurrencyKey" must be a JSON path into the run''s input, such as "$.tenant_id", got %.',
          v_option.value
          using errcode = '22023';
      end;
    elsif jsonb_typeof(v_option.value) <> 'number' or v_option.value::text !~ '^-?[0-9]+$' then
      raise exception 'Invalid flow shape: option "%" must be a whole number, got %.', v_option.key, v_option.value
        using errcode = '22023';
    end if;
  end loop;
end;
$$;

-- pgflow._normalize_flow_shape: source/0116_function_normalize_flow_shape.sql
create or replace function pgflow._normalize_flow_shape(shape jsonb)
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
    ) || case when s.value ? 'subflowSlug' then jsonb_build_object('subflowSlug', s.value -> 'subflowSlug')
      else '{}'::jsonb end
    order by s.ordinality
  ), '[]'::jsonb))
  from jsonb_array_elements(shape -> 'steps') with ordinality as s
$$;

-- pgflow.delete_flow_and_data: source/0117_function_delete_flow_and_data.sql
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
  v_user record;
  v_child record;
begin
  perform pgflow._lock_flow_definition(flow_slug);
  select f.queue_mode into v_mode from pgflow.flows as f where f.flow_slug = delete_flow_and_data.flow_slug;
  if not found then
    return;
  end if;
  -- GUARD: a flow another flow starts as a subflow stays (engine 0028): deleting it would leave
  -- that flow's subflow tasks waiting for runs that are gone.
  select s.flow_slug, s.step_slug into v_user from pgflow.steps as s
  where s.subflow_slug = delete_flow_and_data.flow_slug and s.flow_slug <> delete_flow_and_data.flow_slug
  order by s.flow_slug, s.step_index
  limit 1;
  if found then
    raise exception 'Flow "%" is the subflow of step "%" of flow "%", so it cannot be deleted.',
      flow_slug, v_user.step_slug, v_user.flow_slug
      using errcode = '55000', hint = format('Nothing was deleted. Delete flow "%s" first.', v_user.flow_slug);
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

  -- The subflow runs its runs started (engine 0028) lose their parent, and the ones still
  -- running are cancelled: their flow stays, their parents go.
  for v_child in
    update pgflow.runs as c set parent_run_id = null, parent_step_slug = null, parent_task_index = null
    where c.parent_run_id in (select r.run_id from pgflow.runs as r where r.flow_slug = delete_flow_and_data.flow_slug)
      and c.flow_slug <> delete_flow_and_data.flow_slug
    returning c.run_id, c.status
  loop
    if v_child.status = 'started' then
      perform pgflow._cancel_run(v_child.run_id,
        format('Its parent run was deleted with flow "%s".', delete_flow_and_data.flow_slug));
    end if;
  end loop;

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

-- pgflow._insert_step: source/0119_function_insert_step.sql
create function pgflow._insert_step(
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
  queue_name text,
  subflow_slug text default null
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
  if step_type is null or step_type not in ('single', 'map', 'signal', 'subflow') then
    raise exception 'Invalid step type "%" for step "%".', step_type, step_slug
      using errcode = '22023', hint = 'Use "single", "map", "signal" or "subflow".';
  end if;
  if step_type = 'subflow' and subflow_slug is null then
    raise exception 'Subflow step "%" names no flow.', step_slug
      using errcode = '22023', hint = 'Pass subflow_slug: the slug of the flow whose run the step starts.';
  end if;
  if subflow_slug is not null and step_type not in ('subflow', 'map') then
    raise exception 'Step "%" of type "%" cannot start a subflow.', step_slug, step_type
      using errcode = '22023',
        hint = 'Use step_type "subflow" (one child run) or "map" (one child run per element) with a subflow_slug.';
  end if;
  if subflow_slug is not null and pgflow._slug_violation(subflow_slug) is not null then
    raise exception 'Invalid subflow slug "%" for step "%".', subflow_slug, step_slug
      using errcode = '22023', detail = format('The slug is invalid: %s.', pgflow._slug_violation(subflow_slug));
  end if;
  if lower(subflow_slug) = lower(flow_slug) then
    raise exception 'Step "%" of flow "%" cannot start a run of its own flow.', step_slug, flow_slug
      using errcode = '22023', hint = 'A flow cannot be its own subflow: that would nest for ever.';
  end if;
  if step_type = 'subflow' and cardinality(v_deps) > 1 then
    raise exception 'Subflow step "%" can have at most one dependency, got %.', step_slug, cardinality(v_deps)
      using errcode = '22023',
        hint = 'The child run''s input is the output of its one dependency (or the run input when it has none).';
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
  select s.step_slug into v_unknown from pgflow.steps as s
  where _insert_step.step_type = 'map' and s.flow_slug = _insert_step.flow_slug and s.step_slug = any (v_deps)
    and s.step_type = 'subflow';
  if v_unknown is not null then
    raise exception 'Map step "%" cannot map the output of subflow step "%": a run''s output is an object.',
      step_slug, v_unknown
      using errcode = '22023',
        hint = 'Map a step whose output is an array (a subflow map step outputs one: its child runs'' outputs).';
  end if;

  -- GUARD: an existing step is returned only when identical; definitions never change silently.
  select * into v_step from pgflow.steps as s
  where s.flow_slug = _insert_step.flow_slug and s.step_slug = _insert_step.step_slug;
  if found then
    select coalesce(array_agg(d.dep_slug order by d.dep_slug), '{}') into v_existing_deps
    from pgflow.deps as d where d.flow_slug = _insert_step.flow_slug and d.step_slug = _insert_step.step_slug;
    if v_existing_deps is distinct from (select coalesce(array_agg(d order by d), '{}') from unnest(v_deps) as d)
      or v_step.step_type is distinct from step_type
      or v_step.subflow_slug is distinct from subflow_slug
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
    required_input_pattern, forbidden_input_pattern, when_unmet, when_exhausted, subflow_slug
  )
  select _insert_step.flow_slug, _insert_step.step_slug,
    coalesce((select max(s.step_index) + 1 from pgflow.steps as s where s.flow_slug = _insert_step.flow_slug), 0),
    _insert_step.step_type, cardinality(v_deps), _insert_step.queue_name,
    max_attempts, base_delay, timeout, start_delay,
    required_input_pattern, forbidden_input_pattern, when_unmet, when_exhausted, _insert_step.subflow_slug
  returning * into v_step;

  insert into pgflow.deps (flow_slug, dep_slug, step_slug)
  select _insert_step.flow_slug, d, _insert_step.step_slug from unnest(v_deps) as d;

  return v_step;
end;
$$;

-- pgflow._fail_run: source/0121_function_fail_run.sql
create or replace function pgflow._fail_run(run_id uuid)
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_queues text[];
  v_messages bigint[];
  v_parent_run_id uuid;
  v_child uuid;
begin
  update pgflow.runs as r set status = 'failed', failed_at = clock_timestamp()
  where r.run_id = _fail_run.run_id and r.status = 'started'
  returning r.parent_run_id into v_parent_run_id;
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

  -- Subflows (engine 0028): its children still running fail with it (retry_run of this run
  -- resumes them), then a subflow run's failure fails its parent's task.
  for v_child in
    select c.run_id from pgflow.runs as c
    where c.parent_run_id = _fail_run.run_id and c.status = 'started'
    order by c.run_id
    for update
  loop
    perform pgflow._fail_run(v_child);
  end loop;
  if v_parent_run_id is not null then
    perform pgflow._settle_parent_task(run_id);
  end if;
end;
$$;

-- pgflow._complete_step: source/0122_function_complete_step.sql
create or replace function pgflow._complete_step(run_id uuid, step_slug text, output jsonb)
returns boolean
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_array_length int := case when jsonb_typeof(output) = 'array' then jsonb_array_length(output) end;
  v_flow_slug text;
  v_children record;
  v_run record;
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

  with waiting as (
    select s.step_slug, s.step_index, s.queue_name, coalesce(s.opt_start_delay, 0) as delay,
      bool_and(s.step_type = 'single' and s.required_input_pattern is null
        and s.forbidden_input_pattern is null and s.opt_concurrency_key is null) over () as plain
    from pgflow.deps as d
    join pgflow.steps as s on s.flow_slug = d.flow_slug and s.step_slug = d.step_slug
    where d.flow_slug = v_flow_slug and d.dep_slug = _complete_step.step_slug
  ),
  children as (
    update pgflow.step_states as ss
    set remaining_deps = ss.remaining_deps - 1, initial_tasks = coalesce(ss.initial_tasks, v_array_length),
      status = case when ss.remaining_deps = 1 and w.plain then 'started' else ss.status end,
      started_at = case when ss.remaining_deps = 1 and w.plain then clock_timestamp() else ss.started_at end,
      remaining_tasks = case when ss.remaining_deps = 1 and w.plain then 1 else ss.remaining_tasks end
    from waiting as w
    where ss.run_id = _complete_step.run_id and ss.step_slug = w.step_slug and ss.status = 'created'
    returning ss.step_slug, ss.remaining_deps, ss.status, w.step_index, w.queue_name, w.delay
  )
  select count(*) filter (where c.remaining_deps = 0 and c.status = 'created') as ready,
    array_agg(c.step_slug order by c.step_index) filter (where c.status = 'started') as slugs,
    array_agg(c.queue_name order by c.step_index) filter (where c.status = 'started') as queues,
    array_agg(c.delay order by c.step_index) filter (where c.status = 'started') as delays
  into v_children
  from children as c;

  for i in 1 .. coalesce(cardinality(v_children.slugs), 0) loop
    perform pgflow._enqueue_step_tasks(run_id, v_flow_slug, v_children.slugs[i], v_children.queues[i], 1,
      v_children.delays[i]);
    perform pgflow._emit_event(run_id, 'step:started', v_children.slugs[i], 'started');
  end loop;

  update pgflow.runs as r
  set remaining_steps = r.remaining_steps - 1,
    status = case when r.remaining_steps = 1 and r.status = 'started' then 'completed' else r.status end,
    completed_at = case when r.remaining_steps = 1 and r.status = 'started' then clock_timestamp()
      else r.completed_at end,
    output = case when r.remaining_steps = 1 and r.status = 'started' then (
      select jsonb_object_agg(ss.step_slug, ss.output)
      from pgflow.step_states as ss
      where ss.run_id = r.run_id and ss.status = 'completed'
        and not exists (
          select 1 from pgflow.deps as d where d.flow_slug = ss.flow_slug and d.dep_slug = ss.step_slug
        )
    ) else r.output end
  where r.run_id = _complete_step.run_id
  returning r.remaining_steps = 0 and r.status = 'completed' as finished, r.parent_run_id into v_run;
  if v_run.finished then
    perform pgflow._emit_event(run_id, 'run:completed', null, 'completed');
    -- A subflow run completes its parent's task (engine 0028).
    if v_run.parent_run_id is not null then
      perform pgflow._settle_parent_task(run_id);
    end if;
  end if;
  return v_children.ready > 0;
end;
$$;

-- pgflow._skip_step: source/0123_function_skip_step.sql
create or replace function pgflow._skip_step(run_id uuid, step_slug text, skip_reason text, error_message text)
returns boolean
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_queues text[];
  v_messages bigint[];
  v_flow_slug text;
  v_child uuid;
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
  -- A subflow step's children still running are cancelled (engine 0028).
  for v_child in
    select c.run_id from pgflow.runs as c
    where c.parent_run_id = _skip_step.run_id and c.parent_step_slug = _skip_step.step_slug
      and c.status = 'started'
    order by c.run_id
    for update
  loop
    perform pgflow._cancel_run(v_child, format('Step "%s" of its parent run %s was skipped.', step_slug, run_id));
  end loop;

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

-- pgflow._advance_run: source/0125_function_advance_run.sql
create or replace function pgflow._advance_run(run_id uuid)
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
  v_payload jsonb;
begin
  while v_again loop
    v_again := false;
    for v_step in
      select ss.step_slug, ss.flow_slug, ss.initial_tasks, s.step_type, s.deps_count, s.queue_name,
        s.opt_start_delay, s.required_input_pattern, s.forbidden_input_pattern, s.when_unmet, r.input,
        s.opt_concurrency_key, s.subflow_slug
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

      -- A signal step runs no task: it takes a signal that came early at once, else it waits.
      if v_step.step_type = 'signal' then
        -- GUARD: a skip-cascade earlier in this pass may have closed the step already.
        perform 1 from pgflow.step_states as ss
        where ss.run_id = _advance_run.run_id and ss.step_slug = v_step.step_slug and ss.status = 'created';
        continue when not found;
        update pgflow.signals as sg set used_at = clock_timestamp()
        where sg.run_id = _advance_run.run_id and sg.step_slug = v_step.step_slug
        returning sg.payload into v_payload;
        if found then
          perform pgflow._complete_step(run_id, v_step.step_slug, v_payload);
          v_again := true;
        else
          update pgflow.step_states as ss
          set status = 'started', started_at = clock_timestamp(), remaining_tasks = 1
          where ss.run_id = _advance_run.run_id and ss.step_slug = v_step.step_slug;
          perform pgflow._emit_event(run_id, 'step:started', v_step.step_slug, 'started');
        end if;
        continue;
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
      if v_step.subflow_slug is not null then
        -- A subflow step's tasks start child runs (engine 0028), which may even finish at once.
        perform pgflow._emit_event(run_id, 'step:started', v_step.step_slug, 'started');
        perform pgflow._start_subflow_children(run_id, v_step.step_slug);
        -- GUARD: a child that could not start may have failed the run.
        if not exists (select 1 from pgflow.runs as r where r.run_id = _advance_run.run_id and r.status = 'started') then
          return false;
        end if;
        v_again := true;
        continue;
      elsif v_step.opt_concurrency_key is null then
        perform pgflow._enqueue_step_tasks(run_id, v_step.flow_slug, v_step.step_slug, v_step.queue_name,
          v_step.initial_tasks, coalesce(v_step.opt_start_delay, 0));
      else
        -- A keyed step's tasks are parked under their key's value (engine 0018); they get their
        -- messages as their key has room, when this transaction commits.
        perform pgflow._park_keyed_tasks(v_step.flow_slug, v_step.step_slug, v_step.queue_name,
          v_step.opt_concurrency_key, coalesce(v_step.opt_start_delay, 0), array[run_id],
          array[v_step.initial_tasks]);
      end if;
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

-- pgflow._maybe_complete_run: source/0126_function_maybe_complete_run.sql
create or replace function pgflow._maybe_complete_run(run_id uuid)
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_parent_run_id uuid;
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
  where r.run_id = _maybe_complete_run.run_id and r.status = 'started' and r.remaining_steps = 0
  returning r.parent_run_id into v_parent_run_id;
  if found then
    perform pgflow._emit_event(run_id, 'run:completed', null, 'completed');
    -- A subflow run completes its parent's task (engine 0028).
    if v_parent_run_id is not null then
      perform pgflow._settle_parent_task(run_id);
    end if;
  end if;
end;
$$;

-- pgflow.start_flow: source/0130_function_start_flow.sql
create or replace function pgflow.start_flow(
  flow_slug text, input jsonb, run_id uuid default null, idempotency_key text default null
)
returns setof pgflow.runs
language plpgsql
volatile
security definer
set search_path = ''
as $$
-- The conflict target names columns that are parameters too; every other use is qualified.
#variable_conflict use_column
declare
  v_run_id uuid := coalesce(run_id, gen_random_uuid());
  v_flow record;
  v_run pgflow.runs;
  v_input_length int;
  v_root record;
  v_traceparent text := substring(current_setting('pgflow.traceparent', true)
    from '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$');
begin
  perform pg_advisory_xact_lock_shared(1, hashtext(lower(flow_slug)));
  -- The definition is read once (engine 0026): no row when the flow does not exist, else its
  -- step count, its first root map step, and whether every root step is a plain single step
  -- (no condition), whose step state is then written started.
  select count(s.step_slug)::int as step_count,
    (array_agg(s.step_slug order by s.step_index)
      filter (where s.step_type = 'map' and s.deps_count = 0))[1] as root_map,
    coalesce(bool_and(s.step_type = 'single' and s.required_input_pattern is null
      and s.forbidden_input_pattern is null) filter (where s.deps_count = 0), false) as plain
  into v_flow
  from pgflow.flows as f
  left join pgflow.steps as s on s.flow_slug = f.flow_slug
  where f.flow_slug = start_flow.flow_slug
  group by f.flow_slug;
  if not found then
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
  if v_flow.root_map is not null and jsonb_typeof(input) <> 'array' then
    raise exception 'Flow "%" maps its input in step "%", so the input must be a JSON array, got %.',
      flow_slug, v_flow.root_map, jsonb_typeof(input)
      using errcode = '22023';
  end if;
  if jsonb_typeof(input) = 'array' then
    v_input_length := jsonb_array_length(input);
  end if;

  insert into pgflow.runs (run_id, flow_slug, input, remaining_steps, idempotency_key, traceparent)
  values (v_run_id, flow_slug, input, v_flow.step_count, idempotency_key, v_traceparent)
  on conflict (flow_slug, idempotency_key) where idempotency_key is not null do nothing
  returning * into v_run;
  if not found then  -- a concurrent start with this key won: its run is the one
    return query select * from pgflow.runs as r
      where r.flow_slug = start_flow.flow_slug and r.idempotency_key = start_flow.idempotency_key;
    return;
  end if;

  -- Root steps that are all plain single steps (no condition) are written started, so that no
  -- row is written twice (engine 0025), and get their messages here, as _advance_run would.
  insert into pgflow.step_states (run_id, flow_slug, step_slug, remaining_deps, initial_tasks,
    status, started_at, remaining_tasks)
  select v_run_id, s.flow_slug, s.step_slug, s.deps_count,
    case
      when s.step_type in ('single', 'signal', 'subflow') then 1
      when s.deps_count = 0 then v_input_length
    end,
    case when v_flow.plain and s.deps_count = 0 then 'started' else 'created' end,
    case when v_flow.plain and s.deps_count = 0 then clock_timestamp() end,
    case when v_flow.plain and s.deps_count = 0 then 1 end
  from pgflow.steps as s
  where s.flow_slug = start_flow.flow_slug;

  perform pgflow._emit_event(v_run_id, 'run:started', null, 'started');
  if not v_flow.plain then
    perform pgflow._advance_run(v_run_id);  -- may finish the run (a skip): read it again
    return query select * from pgflow.runs as r where r.run_id = v_run_id;
    return;
  end if;
  for v_root in
    select s.step_slug, s.queue_name, coalesce(s.opt_start_delay, 0) as delay, s.opt_concurrency_key
    from pgflow.steps as s
    where s.flow_slug = start_flow.flow_slug and s.deps_count = 0
    order by s.step_index
  loop
    if v_root.opt_concurrency_key is null then
      perform pgflow._enqueue_step_tasks(v_run_id, flow_slug, v_root.step_slug, v_root.queue_name, 1,
        v_root.delay);
    else
      perform pgflow._park_keyed_tasks(flow_slug, v_root.step_slug, v_root.queue_name,
        v_root.opt_concurrency_key, v_root.delay, array[v_run_id], array[1]);
    end if;
    perform pgflow._emit_event(v_run_id, 'step:started', v_root.step_slug, 'started');
  end loop;
  -- Starting plain root steps never changes the run's row: it is returned as inserted (engine
  -- 0026), not read again.
  return next v_run;
end;
$$;

-- pgflow.cancel_run: source/0135_function_cancel_run.sql
create or replace function pgflow.cancel_run(run_id uuid, reason text default null)
returns pgflow.runs
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_run pgflow.runs;
begin
  select * into v_run from pgflow.runs as r where r.run_id = cancel_run.run_id for update;
  if not found then
    raise exception 'Run % does not exist.', run_id using errcode = 'P0002';
  end if;
  if v_run.status <> 'started' then
    raise exception 'Run % is % already; only a started run can be cancelled.', run_id, v_run.status
      using errcode = '55000', hint = 'Nothing was changed.';
  end if;
  v_run := pgflow._cancel_run(run_id, reason);
  perform pgflow._record_action('cancel', v_run.flow_slug, run_id, null,
    case when reason is not null then jsonb_build_object('reason', reason) end);
  return v_run;
end;
$$;

-- pgflow.pause_step: source/0136_function_pause_step.sql
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
  if exists (
    select 1 from pgflow.steps as s
    where s.flow_slug = pause_step.flow_slug and s.step_slug = pause_step.step_slug and s.subflow_slug is not null
  ) then
    raise exception 'Step "%" of flow "%" is a subflow step: its tasks are child runs, so there is nothing to pause.',
      step_slug, flow_slug
      using errcode = '22023', hint = 'Pause the steps of its subflow, or the steps that depend on it, instead.';
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

-- pgflow.retry_run: source/0138_function_retry_run.sql
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
begin
  select * into v_run from pgflow.runs as r where r.run_id = retry_run.run_id for update;
  if not found then
    raise exception 'Run % does not exist.', run_id using errcode = 'P0002';
  end if;
  if v_run.status <> 'failed' then
    raise exception 'Run % is %; only a failed run can be retried.', run_id, v_run.status
      using errcode = '55000', hint = 'Nothing was changed.';
  end if;
  if v_run.parent_run_id is not null then
    raise exception 'Run % is a subflow run of run %: retry that run.', run_id, v_run.parent_run_id
      using errcode = '55000',
        detail = format('It runs for task %s of step "%s", whose retries start it again.', v_run.parent_task_index,
          v_run.parent_step_slug),
        hint = 'Nothing was changed. Retrying the parent run resumes this one where it failed.';
  end if;
  v_added := pgflow._retry_run(run_id, 0);
  if v_added is not null then
    raise exception 'Run % cannot be retried: flow "%" has changed since it started.', run_id, v_run.flow_slug
      using errcode = '55000', detail = format('Step "%s" was added to the flow after the run started.', v_added),
        hint = 'Nothing was changed. Start a new run.';
  end if;
  perform pgflow._record_action('retry', v_run.flow_slug, run_id, null, null);
  select * into v_run from pgflow.runs as r where r.run_id = retry_run.run_id;
  return v_run;
end;
$$;

-- pgflow.complete_task: source/0141_function_complete_task.sql
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
  select r.status as run_status, ss.status as step_status, ss.remaining_tasks, s.step_type, s.subflow_slug,
    t as task,
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

  -- GUARD: a subflow step's task (engine 0028) ends with its child run, never by a report.
  if v_locked.subflow_slug is not null then
    raise exception 'Task % of step "%" in run % runs a subflow: it ends when its child run does.',
      task_index, step_slug, run_id
      using errcode = '55000', hint = 'Nothing was changed. Complete, fail or cancel the child run instead.';
  end if;

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

  -- The task row records the completion: its message is deleted, not archived (engine 0025).
  perform pgmq.delete(v_task.queue_name, v_task.message_id);
  return next v_task;
end;
$$;

-- pgflow.fail_task: source/0142_function_fail_task.sql
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
  select r.status as run_status, ss.status as step_status, t as task, s.subflow_slug into v_locked
  from pgflow.runs as r
  join pgflow.step_states as ss on ss.run_id = r.run_id and ss.step_slug = fail_task.step_slug
  join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
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

  -- GUARD: a subflow step's task (engine 0028) ends with its child run, never by a report.
  if v_locked.subflow_slug is not null then
    raise exception 'Task % of step "%" in run % runs a subflow: it ends when its child run does.',
      task_index, step_slug, run_id
      using errcode = '55000', hint = 'Nothing was changed. Complete, fail or cancel the child run instead.';
  end if;

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

-- pgflow.complete_tasks: source/0143_function_complete_tasks.sql
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
  v_keyed record;
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
      s.step_type = 'map' as mapped, ss.remaining_tasks, s.subflow_slug is not null as subflow,
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
    (array_agg(l.ord order by l.ord) filter (where l.subflow))[1] as subflow_position,
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

  -- GUARD: a subflow step's task (engine 0028) ends with its child run, never by a report.
  if v_batch.subflow_position is not null then
    raise exception 'Task % of step "%" in run % runs a subflow: it ends when its child run does.',
      task_indexes[v_batch.subflow_position], step_slugs[v_batch.subflow_position], run_ids[v_batch.subflow_position]
      using errcode = '55000', hint = 'Nothing was changed. Complete, fail or cancel the child run instead.';
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
    -- A run with no step left completes in the statement that counts its steps off (engine
    -- 0025): its output joins the leaves completed before (this statement's snapshot shows the
    -- batch's steps as started) with those completed by this batch.
    counted as (
      update pgflow.runs as r set remaining_steps = r.remaining_steps - n.finished,
        status = case when r.remaining_steps = n.finished then 'completed' else r.status end,
        completed_at = case when r.remaining_steps = n.finished then clock_timestamp() else r.completed_at end,
        output = case when r.remaining_steps = n.finished then (
          select jsonb_object_agg(x.step_slug, x.output)
          from (
            select ss.step_slug, ss.flow_slug, ss.output
            from pgflow.step_states as ss
            where ss.run_id = r.run_id and ss.status = 'completed'
            union all
            select f.step_slug, f.flow_slug, f.output from fast as f where f.run_id = r.run_id
          ) as x
          where not exists (
            select 1 from pgflow.deps as d where d.flow_slug = x.flow_slug and d.dep_slug = x.step_slug
          )
        ) else r.output end
      from (select f.run_id, count(*)::int as finished from fast as f group by f.run_id) as n
      where r.run_id = n.run_id
      returning r.run_id, r.remaining_steps, r.parent_run_id
    )
    select array_agg(c.run_id order by c.run_id, s.step_index) as run_ids,
      array_agg(c.flow_slug order by c.run_id, s.step_index) as flow_slugs,
      array_agg(c.step_slug order by c.run_id, s.step_index) as step_slugs,
      array_agg(s.queue_name order by c.run_id, s.step_index) as queue_names,
      array_agg(coalesce(s.opt_start_delay, 0) order by c.run_id, s.step_index) as delays,
      array_agg(c.last order by c.run_id, s.step_index) as positions,
      array_agg(s.step_index order by c.run_id, s.step_index) as step_indexes,
      array_agg(s.opt_concurrency_key order by c.run_id, s.step_index) as key_paths,
      (select array_agg(n.run_id) from counted as n where n.remaining_steps = 0) as finished_runs,
      (select array_agg(n.run_id order by n.run_id) from counted as n
       where n.remaining_steps = 0 and n.parent_run_id is not null) as finished_children,
      (select array_agg(d.queue_name order by d.message_id) from done as d) as done_queues,
      (select array_agg(d.message_id order by d.message_id) from done as d) as done_messages
    into v_started
    from children as c
    join pgflow.steps as s on s.flow_slug = c.flow_slug and s.step_slug = c.step_slug
    where c.remaining_deps = 0;

    -- One message per started child without a key (a single step has one task), one insert per
    -- queue; the task rows are paired with their messages by the task key the message carries.
    for v_queue in
      select distinct q.name from unnest(v_started.queue_names, v_started.key_paths) as q (name, key_path)
      where q.key_path is null order by 1
    loop
      execute format(
        $q$
          with sent as (
            insert into pgmq.%I (vt, message)
            select clock_timestamp() + make_interval(secs => x.delay),
              jsonb_build_object('flow_slug', x.flow_slug, 'run_id', x.run_id, 'step_slug', x.step_slug, 'task_index', 0)
            from unnest($1::uuid[], $2::text[], $3::text[], $4::int[], $5::text[], $7::text[])
              as x (run_id, flow_slug, step_slug, delay, queue_name, key_path)
            where x.queue_name = $6 and x.key_path is null
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
        v_started.queue_names, v_queue, v_started.key_paths;
    end loop;

    -- A started child with a concurrency key has its task parked under its key's value (engine
    -- 0018), as pgflow._advance_run parks it: one call per child step, its runs in the order of
    -- the completions that started them (engine 0027; before, each went through complete_task).
    for v_keyed in
      select k.flow_slug, k.step_slug, k.queue_name, k.key_path, k.delay,
        array_agg(k.run_id order by k.position, k.run_id) as run_ids
      from unnest(v_started.flow_slugs, v_started.step_slugs, v_started.queue_names,
        v_started.key_paths, v_started.delays, v_started.run_ids, v_started.positions)
        as k (flow_slug, step_slug, queue_name, key_path, delay, run_id, position)
      where k.key_path is not null
      group by k.flow_slug, k.step_slug, k.queue_name, k.key_path, k.delay
      order by k.flow_slug, k.step_slug
    loop
      perform pgflow._park_keyed_tasks(v_keyed.flow_slug, v_keyed.step_slug, v_keyed.queue_name,
        v_keyed.key_path, v_keyed.delay, v_keyed.run_ids, array_fill(1, array[cardinality(v_keyed.run_ids)]));
    end loop;

    -- The completed tasks' messages are deleted at once, one call per queue: their task rows
    -- record them (engine 0025; archived before).
    for v_queue in select distinct q.name from unnest(v_started.done_queues) as q (name) order by 1 loop
      perform pgmq.delete(v_queue, array(
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

    -- The runs completed above say so, in run id order.
    if v_started.finished_runs is not null then
      perform pg_notify(
        'pgflow_run_' || replace(f.run_id::text, '-', ''),
        json_build_object('event', 'run:completed', 'run_id', f.run_id, 'step_slug', null, 'status', 'completed')::text
      )
      from unnest(v_started.finished_runs) as f (run_id)
      order by f.run_id;
    end if;
    -- Subflow runs completed above complete their parents' tasks (engine 0028).
    if v_started.finished_children is not null then
      perform pgflow._settle_parent_task(f.run_id) from unnest(v_started.finished_children) as f (run_id);
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
      perform pgmq.delete(v_queue, array(
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

-- pgflow.find_stalled_tasks: source/0149_function_find_stalled_tasks.sql
create or replace function pgflow.find_stalled_tasks()
returns table (run_id uuid, step_slug text, task_index int)
language sql
stable
security definer
set search_path = ''
as $$
  select t.run_id, t.step_slug, t.task_index
  from pgflow.worker_liveness() as l,
    pgflow.step_tasks as t
    join pgflow.runs as r on r.run_id = t.run_id and r.status = 'started'
    join pgflow.step_states as ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug and ss.status = 'started'
    join pgflow.steps as s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug
    join pgflow.flows as f on f.flow_slug = t.flow_slug
  where t.status = 'started' and t.permanently_stalled_at is null and s.subflow_slug is null
    and (
      coalesce(t.lease_renewed_at, t.started_at) < clock_timestamp()
        - make_interval(secs => coalesce(t.claimed_timeout, s.opt_timeout, f.opt_timeout)) - l.stalled_after
      or not exists (
        select 1 from pgflow.workers as w
        where w.worker_id = t.last_worker_id and w.stopped_at is null
          and w.last_heartbeat_at > clock_timestamp() - l.stalled_after
      )
    )
$$;

-- pgflow.prune_data_older_than: source/0151_function_prune_data_older_than.sql
create or replace function pgflow.prune_data_older_than(retention interval, batch_size int default null)
returns jsonb
language plpgsql
volatile
security definer
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
  v_top_runs int;
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
  -- A subflow run goes with its top run (engine 0028), never alone.
  v_runs := array(
    select r.run_id from pgflow.runs as r
    where ((r.status = 'completed' and r.completed_at < v_cutoff)
       or (r.status = 'failed' and r.failed_at < v_cutoff)
       or (r.status = 'cancelled' and r.cancelled_at < v_cutoff))
      and r.parent_run_id is null
    limit batch_size
    for update skip locked
  );
  if cardinality(v_runs) = batch_size then
    v_done := false;
  end if;
  if cardinality(v_runs) = 0 then
    v_runs := null;
  end if;
  v_top_runs := coalesce(cardinality(v_runs), 0);
  -- Their subflow runs, however deep (all finished with them: a finished run ended its children).
  if v_runs is not null and exists (
    select 1 from pgflow.runs as c where c.parent_run_id = any (v_runs)
  ) then
    v_runs := v_runs || array(
      with recursive down (run_id) as (
        select c.run_id from pgflow.runs as c where c.parent_run_id = any (v_runs)
        union all
        select c.run_id from down as d join pgflow.runs as c on c.parent_run_id = d.run_id
      )
      select d.run_id from down as d
      join pgflow.runs as r on r.run_id = d.run_id
      order by d.run_id
      for update of r
    );
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
    'runs', v_top_runs, 'subflow_runs', coalesce(cardinality(v_runs), 0) - v_top_runs, 'workers', v_workers, 'archived_messages', v_archived,
    'done', v_done
  );
end;
$$;

-- pgflow._claim_route: source/0153_function_claim_route.sql
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
  where s.flow_slug = _claim_route.flow_slug and s.step_type <> 'signal' and s.subflow_slug is null
    and (_claim_route.step_slug is null or s.step_slug = _claim_route.step_slug);
end;
$$;

-- pgflow.start_flows: source/0156_function_start_flows.sql
create or replace function pgflow.start_flows(flow_slug text, inputs jsonb[], idempotency_keys text[] default null)
returns setof pgflow.runs
language plpgsql
volatile
security definer
set search_path = ''
as $$
begin
  return query select * from pgflow._start_runs(flow_slug, inputs, idempotency_keys);
end;
$$;

-- pgflow.queue_coverage: source/0163_function_queue_coverage.sql
create or replace function pgflow.queue_coverage(freshness interval default (pgflow.worker_liveness()).live_within)
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
security definer
set search_path = ''
as $$
  select s.flow_slug, s.step_slug, s.step_index, s.queue_name,
    count(w.worker_id)::int, count(w.worker_id) > 0
  from pgflow.steps as s
  left join pgflow.worker_states(queue_coverage.freshness) as w
    on w.queue_name = s.queue_name and w.state = 'live'
  where s.step_type <> 'signal' and s.subflow_slug is null
  group by s.flow_slug, s.step_slug, s.step_index, s.queue_name
  order by s.flow_slug, s.step_index
$$;

-- pgflow.finished_tasks: source/0167_function_finished_tasks.sql
create or replace function pgflow.finished_tasks(since interval default '1 hour', by_step boolean default true)
returns table (queue_name text, step_slug text, minute timestamptz, tasks bigint)
language plpgsql
stable
security definer
set search_path = ''
-- Its few rows are not worth parallel workers (starting them cost 6 ms of a 1 ms query).
set max_parallel_workers_per_gather = 0
as $$
declare
  v_queue record;
  v_parts text[] := array[
    'select t.queue_name, case when $2 then t.step_slug end as step_slug,'
    ' date_trunc(''minute'', t.completed_at) as minute, count(*) as tasks'
    ' from pgflow.step_tasks as t where t.completed_at > now() - $1 and t.status = ''completed'''
    ' group by 1, 2, 3'];
begin
  for v_queue in
    select q.queue_name, min(q.step_slug) as only_step, count(distinct q.step_slug) = 1 as one_step
    from (
      select s.queue_name, s.step_slug from pgflow.steps as s where s.step_type <> 'signal'
        and s.subflow_slug is null
      union
      select pgflow.default_queue_name(f.flow_slug), null from pgflow.flows as f
      where f.queue_mode = 'flow'
    ) as q
    group by q.queue_name
    order by q.queue_name
  loop
    continue when to_regclass(format('pgmq.%I', pgflow.pgmq_table_name(v_queue.queue_name, 'a'))) is null;
    v_parts := v_parts || format(
      'select %1$L::text, case when $2 then %2$s end, date_trunc(''minute'', a.archived_at), count(*)'
      ' from pgmq.%3$I as a where a.archived_at > now() - $1'
      ' and not exists (select 1 from pgflow.step_tasks as t'
      '   where t.message_id = a.msg_id and t.queue_name = %1$L and t.status = ''completed'')'
      ' group by 1, 2, 3',
      v_queue.queue_name,
      case when v_queue.one_step then quote_nullable(v_queue.only_step) || '::text'
        else 'a.message ->> ''step_slug''' end,
      pgflow.pgmq_table_name(v_queue.queue_name, 'a'));
  end loop;
  return query execute
    'select f.queue_name, f.step_slug, f.minute, sum(f.tasks)::bigint from ('
    || array_to_string(v_parts, ' union all ')
    || ') as f group by 1, 2, 3'
    using since, by_step;
end;
$$;

-- pgflow.set_step_limits: source/0170_function_set_step_limits.sql
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
  perform 1 from pgflow.steps as s
  where s.flow_slug = set_step_limits.flow_slug and s.step_slug = set_step_limits.step_slug
  for no key update;
  if exists (
    select 1 from pgflow.steps as s
    where s.flow_slug = set_step_limits.flow_slug and s.step_slug = set_step_limits.step_slug
      and s.step_type = 'signal'
  ) then
    raise exception 'Step "%" of flow "%" is a signal step: it runs no task, so there is nothing to limit.',
      step_slug, flow_slug
      using errcode = '22023', hint = 'Limit the steps that depend on it instead.';
  end if;
  if exists (
    select 1 from pgflow.steps as s
    where s.flow_slug = set_step_limits.flow_slug and s.step_slug = set_step_limits.step_slug
      and s.subflow_slug is not null
  ) then
    raise exception 'Step "%" of flow "%" is a subflow step: its tasks are child runs, so there is nothing to limit.',
      step_slug, flow_slug
      using errcode = '22023', hint = 'Limit the steps of its subflow instead.';
  end if;
  v_limits := pgflow._put_step_limits(flow_slug, step_slug, max_in_flight, rate_limit, rate_period_s, 'operator');
  if v_limits is null and not exists (
    select 1 from pgflow.steps as s
    where s.flow_slug = set_step_limits.flow_slug and s.step_slug = set_step_limits.step_slug
      and (s.opt_max_in_flight is not null or s.opt_rate_limit is not null)
  ) then
    delete from pgflow.step_limit_overrides as o
    where o.flow_slug = set_step_limits.flow_slug and o.step_slug = set_step_limits.step_slug;
  else
    insert into pgflow.step_limit_overrides as o
      (flow_slug, step_slug, max_in_flight, rate_limit, rate_period_s, set_at, actor, label)
    values (set_step_limits.flow_slug, set_step_limits.step_slug, set_step_limits.max_in_flight,
      set_step_limits.rate_limit, set_step_limits.rate_period_s, now(), session_user,
      left(nullif(current_setting('pgflow.action_label', true), ''), 200))
    on conflict on constraint step_limit_overrides_pkey do update
    set max_in_flight = excluded.max_in_flight, rate_limit = excluded.rate_limit,
      rate_period_s = excluded.rate_period_s, set_at = excluded.set_at, actor = excluded.actor,
      label = excluded.label;
  end if;
  perform pgflow._record_action('limits', flow_slug, null, step_slug, jsonb_build_object(
    'max_in_flight', max_in_flight, 'rate_limit', rate_limit, 'rate_period_s', rate_period_s));
  return v_limits;
end;
$$;

-- pgflow._fail_attempt: source/0194_function_fail_attempt.sql
create or replace function pgflow._fail_attempt(
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
  v_child record;
begin
  select * into v_task from pgflow.step_tasks as t
  where t.run_id = _fail_attempt.run_id and t.step_slug = _fail_attempt.step_slug
    and t.task_index = _fail_attempt.task_index;
  select s.when_exhausted, s.subflow_slug,
    coalesce(s.opt_max_attempts, f.opt_max_attempts) as max_attempts,
    coalesce(s.opt_base_delay, f.opt_base_delay) as base_delay
  into v_step
  from pgflow.steps as s
  join pgflow.flows as f on f.flow_slug = s.flow_slug
  where s.flow_slug = v_task.flow_slug and s.step_slug = v_task.step_slug;
  -- The attempt within the task's budget (the budget starts again with each retry_run).
  v_attempt := v_task.attempts_count - v_task.attempts_before_retry;

  if v_attempt < v_step.max_attempts and v_step.subflow_slug is not null and permanent_reason is null then
    select c.run_id, c.status into v_child from pgflow.runs as c
    where c.parent_run_id = _fail_attempt.run_id and c.parent_step_slug = _fail_attempt.step_slug
      and c.parent_task_index = _fail_attempt.task_index
    order by c.started_at desc, c.run_id
    limit 1;
    if v_child.status is not distinct from 'failed' then
      -- The next attempt starts before the child resumes: the child may finish at once, and
      -- then completes this attempt.
      update pgflow.step_tasks as t
      set attempts_count = t.attempts_count + 1, started_at = clock_timestamp(),
        error_message = _fail_attempt.error_message
      where t.run_id = _fail_attempt.run_id and t.step_slug = _fail_attempt.step_slug
        and t.task_index = _fail_attempt.task_index;
      if pgflow._retry_run(v_child.run_id, pgflow.calculate_retry_delay(v_step.base_delay, v_attempt)) is null then
        select * into v_task from pgflow.step_tasks as t
        where t.run_id = _fail_attempt.run_id and t.step_slug = _fail_attempt.step_slug
          and t.task_index = _fail_attempt.task_index;
        return v_task;
      end if;
      -- The child's flow gained a step since it started: it cannot resume, and the attempt
      -- fails as the last one would.
    end if;
  elsif v_attempt < v_step.max_attempts and v_task.permanently_stalled_at is null
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
  if v_task.message_id is not null then
    perform pgmq.archive(v_task.queue_name, v_task.message_id);
  end if;
  return v_task;
end;
$$;

-- pgflow._run_ancestors: source/0207_function_run_ancestors.sql
create function pgflow._run_ancestors(run_id uuid)
returns table (run_id uuid, depth int, flow_slug text, traceparent text)
language sql
stable
set search_path = ''
as $$
  with recursive up (run_id, depth, flow_slug, traceparent, parent_run_id) as (
    select r.run_id, 1, r.flow_slug, r.traceparent, r.parent_run_id
    from pgflow.runs as r where r.run_id = _run_ancestors.run_id
    union all
    select r.run_id, u.depth + 1, r.flow_slug, r.traceparent, r.parent_run_id
    from up as u
    join pgflow.runs as r on r.run_id = u.parent_run_id
    where u.depth < 9
  )
  select u.run_id, u.depth, u.flow_slug, u.traceparent from up as u
$$;

-- pgflow._start_subflow_children: source/0208_function_start_subflow_children.sql
create function pgflow._start_subflow_children(run_id uuid, step_slug text, task_indexes int[] default null)
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_step record;
  v_source jsonb;
  v_indexes int[];
  v_inputs jsonb[];
  v_error text;
begin
  select s.flow_slug, s.step_type, s.subflow_slug, s.queue_name, ss.initial_tasks, r.input,
    (select d.dep_slug from pgflow.deps as d where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug) as dep
  into v_step
  from pgflow.step_states as ss
  join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
  join pgflow.runs as r on r.run_id = ss.run_id
  where ss.run_id = _start_subflow_children.run_id and ss.step_slug = _start_subflow_children.step_slug;

  if v_step.dep is null then
    v_source := v_step.input;
  else
    select ss.output into v_source from pgflow.step_states as ss
    where ss.run_id = _start_subflow_children.run_id and ss.step_slug = v_step.dep and ss.status = 'completed';
  end if;

  v_indexes := coalesce(task_indexes, array(select generate_series(0, v_step.initial_tasks - 1)));
  if task_indexes is null then
    insert into pgflow.step_tasks (run_id, flow_slug, step_slug, task_index, status, attempts_count,
      queue_name, started_at)
    select _start_subflow_children.run_id, v_step.flow_slug, _start_subflow_children.step_slug, g.n, 'started', 1,
      v_step.queue_name, clock_timestamp()
    from unnest(v_indexes) as g (n);
  end if;
  v_inputs := array(
    select case when v_step.step_type = 'map' then v_source -> g.n else coalesce(v_source, 'null') end
    from unnest(v_indexes) with ordinality as g (n, ord)
    order by g.ord
  );

  begin
    perform pgflow._start_runs(v_step.subflow_slug, v_inputs, null, run_id, step_slug, v_indexes);
    return;
  exception when no_data_found or null_value_not_allowed or invalid_parameter_value
    or program_limit_exceeded then
    null;  -- some child cannot start: one by one, below, so that only its task fails
  end;

  for i in 1 .. cardinality(v_indexes) loop
    v_error := pgflow._start_subflow_child(run_id, step_slug, v_indexes[i], v_step.subflow_slug, v_inputs[i]);
    if v_error is not null then
      perform pgflow._fail_attempt(run_id, step_slug, v_indexes[i], v_error, 'the subflow run could not start');
      -- GUARD: the failure may have closed the step or the run; then nothing more starts.
      exit when not exists (
        select 1 from pgflow.step_states as ss
        join pgflow.runs as r on r.run_id = ss.run_id and r.status = 'started'
        where ss.run_id = _start_subflow_children.run_id and ss.step_slug = _start_subflow_children.step_slug
          and ss.status = 'started'
      );
    end if;
  end loop;
end;
$$;

-- pgflow._start_subflow_child: source/0209_function_start_subflow_child.sql
create function pgflow._start_subflow_child(
  run_id uuid, step_slug text, task_index int, subflow_slug text, input jsonb
)
returns text
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_message text;
  v_hint text;
begin
  perform pgflow._start_runs(subflow_slug, array[input], null, run_id, step_slug, array[task_index]);
  return null;
exception when no_data_found or null_value_not_allowed or invalid_parameter_value
  or program_limit_exceeded then
  get stacked diagnostics v_message = message_text, v_hint = pg_exception_hint;
  return format('The subflow run could not start: %s', v_message)
    || case when v_hint <> '' then E'\n' || v_hint else '' end;
end;
$$;

-- pgflow._retry_run: source/0210_function_retry_run_internal.sql
create function pgflow._retry_run(run_id uuid, delay_seconds int)
returns text
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_added text;
  v_flow_slug text;
  v_subflow record;
  v_child record;
  v_queue text;
  v_keys jsonb;
  v_sent record;
begin
  select r.flow_slug into v_flow_slug from pgflow.runs as r where r.run_id = _retry_run.run_id for update;
  -- GUARD: the run's steps must still be its flow's (add_step can extend a flow-mode flow).
  select s.step_slug into v_added from pgflow.steps as s
  where s.flow_slug = v_flow_slug
    and not exists (
      select 1 from pgflow.step_states as ss where ss.run_id = _retry_run.run_id and ss.step_slug = s.step_slug
    )
  order by s.step_index
  limit 1;
  if v_added is not null then
    return v_added;
  end if;

  perform 1 from pgflow.step_states as ss
  where ss.run_id = _retry_run.run_id and ss.status in ('created', 'started', 'failed')
  order by ss.step_slug
  for update;
  perform 1 from pgflow.step_tasks as t
  join pgflow.step_states as ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug
  where t.run_id = _retry_run.run_id and ss.status in ('started', 'failed')
    and t.status in ('failed', 'cancelled')
  order by t.step_slug, t.task_index
  for update of t;

  -- The tasks that did not complete are queued again, each with a new message (visible after
  -- delay_seconds). A subflow step's tasks have none (below).
  for v_queue, v_keys in
    select t.queue_name, jsonb_agg(jsonb_build_object(
        'flow_slug', t.flow_slug, 'run_id', t.run_id, 'step_slug', t.step_slug, 'task_index', t.task_index
      ) order by t.step_slug, t.task_index)
    from pgflow.step_tasks as t
    join pgflow.step_states as ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug
    join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    where t.run_id = _retry_run.run_id and ss.status in ('started', 'failed')
      and t.status in ('failed', 'cancelled') and t.concurrency_key is null and s.subflow_slug is null
    group by t.queue_name
    order by t.queue_name
  loop
    for v_sent in execute format(
      'insert into pgmq.%I (vt, message) select $2, k.value from jsonb_array_elements($1) as k'
      ' returning msg_id, message ->> ''step_slug'' as step_slug, (message ->> ''task_index'')::int as task_index',
      pgflow.pgmq_table_name(v_queue))
      using v_keys, clock_timestamp() + make_interval(secs => delay_seconds)
    loop
      update pgflow.step_tasks as t
      set status = 'queued', message_id = v_sent.msg_id, attempts_before_retry = t.attempts_count,
        queued_at = clock_timestamp(),
        started_at = null, failed_at = null, output = null, last_worker_id = null, requeued_count = 0,
        last_requeued_at = null, permanently_stalled_at = null, claimed_timeout = null, lease_renewed_at = null
      where t.run_id = _retry_run.run_id and t.step_slug = v_sent.step_slug and t.task_index = v_sent.task_index;
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
  where t.run_id = _retry_run.run_id and ss.run_id = t.run_id and ss.step_slug = t.step_slug
    and ss.status in ('started', 'failed') and t.status in ('failed', 'cancelled')
    and t.concurrency_key is not null;

  -- A subflow step's task (engine 0028) starts its next attempt at once: its child run resumes
  -- below, once this run is started again.
  with restarted as (
    update pgflow.step_tasks as t
    set status = 'started', attempts_before_retry = t.attempts_count, attempts_count = t.attempts_count + 1,
      started_at = clock_timestamp(), failed_at = null, output = null
    from pgflow.step_states as ss, pgflow.steps as s
    where t.run_id = _retry_run.run_id and ss.run_id = t.run_id and ss.step_slug = t.step_slug
      and s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
      and ss.status in ('started', 'failed') and t.status in ('failed', 'cancelled')
      and s.subflow_slug is not null
    returning t.step_slug, t.task_index
  )
  select array_agg(x.step_slug order by x.step_slug, x.task_index) as step_slugs,
    array_agg(x.task_index order by x.step_slug, x.task_index) as task_indexes
  into v_subflow
  from restarted as x;

  -- Steps with tasks run again (their unfinished tasks are queued); failed ones without (a
  -- condition, a signal) are ready again; a waiting signal step waits anew.
  with counts as (
    select ss.step_slug, ss.status, s.step_type, count(x.task_index)::int as tasks,
      count(x.task_index) filter (where x.status <> 'completed')::int as unfinished
    from pgflow.step_states as ss
    join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    left join pgflow.step_tasks as x on x.run_id = ss.run_id and x.step_slug = ss.step_slug
    where ss.run_id = _retry_run.run_id and ss.status in ('started', 'failed')
    group by ss.step_slug, ss.status, s.step_type
  )
  update pgflow.step_states as ss
  set status = case when c.status = 'failed' and c.tasks = 0 then 'created' else 'started' end,
    remaining_tasks = case when c.tasks > 0 then c.unfinished when c.status = 'started' then ss.remaining_tasks end,
    started_at = case when c.step_type = 'signal' then clock_timestamp() else ss.started_at end,
    failed_at = null, error_message = null
  from counts as c
  where ss.run_id = _retry_run.run_id and ss.step_slug = c.step_slug;

  update pgflow.runs as r
  set status = 'started', failed_at = null, retry_count = r.retry_count + 1, retried_at = clock_timestamp()
  where r.run_id = _retry_run.run_id;
  perform pgflow._emit_event(run_id, 'run:retried', null, 'started');

  -- Each restarted subflow task's child: a failed one is retried in place (its completed steps
  -- keep their outputs); one that was cancelled, or cannot be retried, is replaced by a new run.
  for v_child in
    select k.step_slug, k.task_index, c.run_id as child_run_id, c.status as child_status
    from unnest(v_subflow.step_slugs, v_subflow.task_indexes) as k (step_slug, task_index)
    left join lateral (
      select x.run_id, x.status from pgflow.runs as x
      where x.parent_run_id = _retry_run.run_id and x.parent_step_slug = k.step_slug
        and x.parent_task_index = k.task_index
      order by x.started_at desc, x.run_id
      limit 1
    ) as c on true
  loop
    -- GUARD: a resumed child may have finished at once and failed this run again.
    exit when not exists (select 1 from pgflow.runs as r where r.run_id = _retry_run.run_id and r.status = 'started');
    if v_child.child_status is not distinct from 'failed' and pgflow._retry_run(v_child.child_run_id, 0) is null then
      continue;
    end if;
    perform pgflow._start_subflow_children(run_id, v_child.step_slug, array[v_child.task_index]);
  end loop;

  -- Steps ready but never started when the run failed, and the ones made ready above.
  if exists (select 1 from pgflow.runs as r where r.run_id = _retry_run.run_id and r.status = 'started') then
    perform pgflow._advance_run(run_id);
  end if;
  return null;
end;
$$;

-- pgflow._settle_parent_task: source/0211_function_settle_parent_task.sql
create function pgflow._settle_parent_task(child_run_id uuid)
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_child pgflow.runs;
  v_parent record;
  v_failure text;
begin
  select * into v_child from pgflow.runs as r where r.run_id = _settle_parent_task.child_run_id;
  if v_child.parent_run_id is null or v_child.status = 'started' then
    return;
  end if;
  select r.status as run_status, ss.status as step_status, ss.remaining_tasks, s.step_type, t.status as task_status
  into v_parent
  from pgflow.runs as r
  join pgflow.step_states as ss on ss.run_id = r.run_id and ss.step_slug = v_child.parent_step_slug
  join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
  join pgflow.step_tasks as t
    on t.run_id = r.run_id and t.step_slug = ss.step_slug and t.task_index = v_child.parent_task_index
  where r.run_id = v_child.parent_run_id
  for update of r, ss, t;
  -- GUARD: the parent moved on without this child (failed, cancelled, or skipped the step).
  if not found or v_parent.run_status <> 'started' or v_parent.step_status <> 'started'
    or v_parent.task_status <> 'started' then
    return;
  end if;

  if v_child.status = 'completed' then
    update pgflow.step_tasks as t
    set status = 'completed', output = v_child.output, completed_at = clock_timestamp()
    where t.run_id = v_child.parent_run_id and t.step_slug = v_child.parent_step_slug
      and t.task_index = v_child.parent_task_index;
    if v_parent.remaining_tasks > 1 then
      update pgflow.step_states as ss set remaining_tasks = ss.remaining_tasks - 1
      where ss.run_id = v_child.parent_run_id and ss.step_slug = v_child.parent_step_slug;
    elsif pgflow._complete_step(v_child.parent_run_id, v_child.parent_step_slug,
        case when v_parent.step_type = 'map' then (
          select jsonb_agg(t.output order by t.task_index)
          from pgflow.step_tasks as t
          where t.run_id = v_child.parent_run_id and t.step_slug = v_child.parent_step_slug
        ) else v_child.output end) then
      perform pgflow._advance_run(v_child.parent_run_id);
    end if;
    return;
  end if;

  -- The child's first failed step says why (its error's first line).
  select format('step "%s": %s', ss.step_slug, split_part(ss.error_message, E'\n', 1)) into v_failure
  from pgflow.step_states as ss
  join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
  where ss.run_id = v_child.run_id and ss.status = 'failed'
  order by ss.failed_at, s.step_index
  limit 1;
  if v_child.status = 'failed' then
    perform pgflow._fail_attempt(v_child.parent_run_id, v_child.parent_step_slug, v_child.parent_task_index,
      format('Subflow run %s of flow "%s" failed%s', v_child.run_id, v_child.flow_slug,
        coalesce(': ' || v_failure, '.')));
  else
    perform pgflow._fail_attempt(v_child.parent_run_id, v_child.parent_step_slug, v_child.parent_task_index,
      format('Subflow run %s of flow "%s" was cancelled%s', v_child.run_id, v_child.flow_slug,
        coalesce(': ' || v_child.cancel_reason, '.')),
      'its subflow run was cancelled');
  end if;
end;
$$;

-- pgflow._cancel_run: source/0212_function_cancel_run_internal.sql
create function pgflow._cancel_run(run_id uuid, reason text)
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
  v_child uuid;
begin
  perform 1 from pgflow.step_states as ss
  where ss.run_id = _cancel_run.run_id and ss.status in ('created', 'started')
  order by ss.step_slug
  for update;
  update pgflow.step_states as ss set status = 'cancelled', remaining_tasks = null
  where ss.run_id = _cancel_run.run_id and ss.status in ('created', 'started');

  with locked as (
    select t.step_slug, t.task_index, t.status
    from pgflow.step_tasks as t
    where t.run_id = _cancel_run.run_id and t.status in ('queued', 'started')
    order by t.step_slug, t.task_index
    for update
  ),
  cancelled as (
    update pgflow.step_tasks as t set status = 'cancelled'
    from locked
    where t.run_id = _cancel_run.run_id and t.step_slug = locked.step_slug
      and t.task_index = locked.task_index and t.status in ('queued', 'started')
    returning t.queue_name, t.message_id, locked.status as was
  )
  select array_agg(c.queue_name), array_agg(c.message_id),
    array_agg(distinct c.queue_name) filter (where c.was = 'started' and c.message_id is not null)
  into v_queues, v_messages, v_running
  from cancelled as c;
  perform pgflow._archive_task_messages(v_queues, v_messages);

  update pgflow.runs as r
  set status = 'cancelled', cancelled_at = clock_timestamp(), cancel_reason = _cancel_run.reason
  where r.run_id = _cancel_run.run_id
  returning * into v_run;

  perform pgflow._emit_event(run_id, 'run:cancelled', null, 'cancelled');
  -- Workers listen on their queue's insert channel; a payload tells this apart from an insert.
  foreach v_queue in array coalesce(v_running, '{}') loop
    perform pg_notify(
      'pgmq.' || pgflow.pgmq_table_name(v_queue) || '.INSERT',
      json_build_object('event', 'run:cancelled', 'run_id', run_id)::text
    );
  end loop;

  -- Subflows (engine 0028): its children still running are cancelled with it, then a subflow
  -- run's cancellation fails its parent's task.
  for v_child in
    select c.run_id from pgflow.runs as c
    where c.parent_run_id = _cancel_run.run_id and c.status = 'started'
    order by c.run_id
    for update
  loop
    perform pgflow._cancel_run(v_child, format('Its parent run %s was cancelled.', run_id));
  end loop;
  if v_run.parent_run_id is not null then
    perform pgflow._settle_parent_task(run_id);
  end if;
  return v_run;
end;
$$;

-- pgflow._start_runs: source/0213_function_start_runs.sql
create function pgflow._start_runs(
  flow_slug text, inputs jsonb[], idempotency_keys text[] default null,
  parent_run_id uuid default null, parent_step_slug text default null, parent_task_indexes int[] default null
)
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
  v_flow record;
  v_bad record;
  v_ids uuid[];
  v_new uuid[];
  v_new_inputs jsonb[];
  v_root record;
  v_traceparent text := substring(current_setting('pgflow.traceparent', true)
    from '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$');
  v_indexes int[] := coalesce(parent_task_indexes, array_fill(null::int, array[v_count]));
begin
  perform pg_advisory_xact_lock_shared(1, hashtext(lower(flow_slug)));
  -- The definition is read once (engine 0026), as start_flow reads it.
  select count(s.step_slug)::int as step_count,
    (array_agg(s.step_slug order by s.step_index)
      filter (where s.step_type = 'map' and s.deps_count = 0))[1] as root_map,
    coalesce(bool_and(s.step_type = 'single' and s.required_input_pattern is null
      and s.forbidden_input_pattern is null) filter (where s.deps_count = 0), false) as plain
  into v_flow
  from pgflow.flows as f
  left join pgflow.steps as s on s.flow_slug = f.flow_slug
  where f.flow_slug = _start_runs.flow_slug
  group by f.flow_slug;
  if not found then
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
  if v_flow.root_map is not null then
    select i.n, jsonb_typeof(i.input) as kind into v_bad from unnest(inputs) with ordinality as i (input, n)
    where jsonb_typeof(i.input) <> 'array' order by i.n limit 1;
    if found then
      -- (A lone child run's input has no position to name.)
      raise exception 'Flow "%" maps its input in step "%", so % must be a JSON array, got %.',
        flow_slug, v_flow.root_map,
        case when _start_runs.parent_run_id is not null and v_count = 1 then 'its input'
          else format('input %s', v_bad.n) end,
        v_bad.kind
        using errcode = '22023';
    end if;
  end if;

  if _start_runs.parent_run_id is not null then
    v_traceparent := pgflow._child_traceparent(_start_runs.parent_run_id, flow_slug);
  end if;

  v_ids := array(select gen_random_uuid() from generate_series(1, v_count));
  with started as (
    insert into pgflow.runs (run_id, flow_slug, input, remaining_steps, idempotency_key, traceparent,
      parent_run_id, parent_step_slug, parent_task_index)
    select w.run_id, _start_runs.flow_slug, w.input, v_flow.step_count, w.key, v_traceparent,
      _start_runs.parent_run_id, _start_runs.parent_step_slug, w.task_index
    from unnest(v_ids, inputs, coalesce(idempotency_keys, array_fill(null::text, array[v_count])),
      v_indexes)
      with ordinality as w (run_id, input, key, task_index, n)
    order by w.n
    on conflict (flow_slug, idempotency_key) where idempotency_key is not null do nothing
    returning run_id, input
  )
  select coalesce(array_agg(s.run_id), '{}'), coalesce(array_agg(s.input), '{}')
  into v_new, v_new_inputs
  from started as s;

  if cardinality(v_new) > 0 then
    -- Plain root steps start in the same statement (each has its one task, queued below). The
    -- new runs' inputs come from the insert, not from reading the runs again (engine 0026).
    insert into pgflow.step_states (run_id, flow_slug, step_slug, remaining_deps, initial_tasks,
      status, started_at, remaining_tasks)
    select r.run_id, s.flow_slug, s.step_slug, s.deps_count,
      case
        when s.step_type in ('single', 'signal', 'subflow') then 1
        when s.deps_count = 0 then jsonb_array_length(r.input)
      end,
      case when v_flow.plain and s.deps_count = 0 then 'started' else 'created' end,
      case when v_flow.plain and s.deps_count = 0 then clock_timestamp() end,
      case when v_flow.plain and s.deps_count = 0 then 1 end
    from unnest(v_new, v_new_inputs) as r (run_id, input)
    cross join pgflow.steps as s
    where s.flow_slug = _start_runs.flow_slug;
    perform pg_notify(
      'pgflow_run_' || replace(r.run_id::text, '-', ''),
      json_build_object('event', 'run:started', 'run_id', r.run_id, 'step_slug', null, 'status', 'started')::text
    )
    from unnest(v_new) as r (run_id);

    if v_flow.plain then
      -- Every root step starts with one task in every new run: one message insert per root
      -- step, its task rows paired with their messages by the task key the message carries.
      for v_root in
        select s.step_slug, s.queue_name, coalesce(s.opt_start_delay, 0) as delay, s.opt_concurrency_key
        from pgflow.steps as s
        where s.flow_slug = _start_runs.flow_slug and s.deps_count = 0
        order by s.step_index
      loop
        if v_root.opt_concurrency_key is not null then
          -- A keyed root step's tasks are parked under their key's value (engine 0018).
          perform pgflow._park_keyed_tasks(flow_slug, v_root.step_slug, v_root.queue_name,
            v_root.opt_concurrency_key, v_root.delay, v_new, array_fill(1, array[cardinality(v_new)]));
        else
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
        end if;
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
    where w.key is not null and x.flow_slug = _start_runs.flow_slug and x.idempotency_key = w.key
    limit 1
  ) as r
  order by w.n;
end;
$$;

-- pgflow._child_traceparent: source/0214_function_child_traceparent.sql
create function pgflow._child_traceparent(parent_run_id uuid, flow_slug text)
returns text
language plpgsql
stable
set search_path = ''
as $$
declare
  v_depth int;
  v_parent_trace text;
  v_parent_flow text;
  v_hex text := replace(parent_run_id::text, '-', '');
begin
  select count(*), (array_agg(a.traceparent order by a.depth))[1], (array_agg(a.flow_slug order by a.depth))[1]
  into v_depth, v_parent_trace, v_parent_flow
  from pgflow._run_ancestors(_child_traceparent.parent_run_id) as a;
  if v_depth > 8 then
    raise exception 'Run % of flow "%" cannot start a subflow run of flow "%": subflows nest at most 8 deep.',
      parent_run_id, v_parent_flow, flow_slug
      using errcode = '54000', hint = 'Check the flows for a cycle: a flow that is its own subflow, directly or not.';
  end if;
  return coalesce(v_parent_trace,
    format('00-%s-%s-01', v_hex, coalesce(nullif(right(v_hex, 16), '0000000000000000'), '0000000000000001')));
end;
$$;
-- No engine function runs for PUBLIC (engine 0019), those above included.
revoke execute on all functions in schema pgflow from public;

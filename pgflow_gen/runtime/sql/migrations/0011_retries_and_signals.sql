-- Engine migration 0011: retrying a failed run, signal steps, and failures that are not retried.
--
-- pgflow.retry_run(run_id) starts a failed run again from where it failed: the tasks that did
-- not complete are queued again with fresh attempts, completed work keeps its outputs; runs count
-- their retries (runs.retry_count, runs.retried_at).
--
-- Signal steps (steps.step_type 'signal') run no task: such a step waits until
-- pgflow.send_signal(run_id, step_slug, payload) gives it its output, checked against its
-- payload schema (steps.payload_schema, part of the flow's description, checked by the new
-- pgflow.schema_violation). A signal sent before its step is ready waits in pgflow.signals. A
-- step's opt_timeout is how long it waits; then stall recovery (requeue_stalled_tasks, which every
-- worker's sweep runs) fails it or skips it (skip_reason signal_timed_out). A signal step has a
-- reserved route but no queue, is left out of queue_coverage, and cannot be paused.
--
-- pgflow.fail_task takes a `permanent_reason` (a sixth parameter, default null): such a failure
-- is not retried, whatever attempts are left, and its stored error says so and why. Calls with
-- four or five arguments are unchanged.
--
-- Workers and clients of earlier releases run on it unchanged (a flow with a signal step needs
-- this release's generated code).

alter domain pgflow.skip_reason drop constraint skip_reason_is_known;
alter domain pgflow.skip_reason add constraint skip_reason_is_known check (
    value in ('condition_unmet', 'handler_failed', 'dependency_skipped', 'signal_timed_out')
  );

alter table pgflow.steps drop constraint step_type_is_known;
alter table pgflow.steps
  add constraint step_type_is_known check (step_type in ('single', 'map', 'signal')),
  add column payload_schema jsonb,
  add constraint payload_schema_is_a_signal_schema check (
    payload_schema is null or (step_type = 'signal' and jsonb_typeof(payload_schema) = 'object')
  );

alter table pgflow.runs
  add column retry_count int not null default 0,
  add column retried_at timestamptz;

-- The signals runs have received (pgflow.send_signal), one per signal step of a run: a signal
-- sent before its step is ready waits here (used_at null) until the step becomes ready and takes
-- it as its output; one sent to a waiting step is used at once. The primary key refuses a second
-- signal for a step. Gone with the run's step states (pruning, deleting the flow).
create table pgflow.signals (
  run_id uuid not null,
  step_slug text not null,
  payload jsonb not null,
  received_at timestamptz not null default now(),
  used_at timestamptz,
  primary key (run_id, step_slug),
  foreign key (run_id, step_slug) references pgflow.step_states (run_id, step_slug) on delete cascade
);

-- Checks a JSON value against a JSON Schema of the specs' type language: type (a name or a list;
-- "integer" is a whole number), properties, required, items, enum, const, anyOf,
-- additionalProperties, and $ref into the root schema's $defs; other keywords (description) are
-- ignored. Returns the first violation as "<path>: <what is wrong>" (the path as $.a.b[2]), or
-- null when the value matches. Pure. send_signal checks a signal's payload with it.
create function pgflow.schema_violation(value jsonb, schema jsonb, root jsonb default null, path text default '$')
returns text
language plpgsql
immutable
parallel safe
set search_path = ''
as $$
declare
  v_root jsonb := coalesce(root, schema);
  v_actual text := jsonb_typeof(value);
  v_wanted text[];
  v_key text;
  v_child jsonb;
  v_problem text;
  v_first text;
  v_index int;
begin
  if schema is null or jsonb_typeof(schema) <> 'object' then
    return null;  -- no schema: any JSON value
  end if;
  if schema ? '$ref' then
    v_child := v_root #> array['$defs', substr(schema ->> '$ref', length('#/$defs/') + 1)];
    if v_child is null then
      return format('%s: the schema refers to %s, which its $defs do not define', path, schema ->> '$ref');
    end if;
    return pgflow.schema_violation(value, v_child, v_root, path);
  end if;

  if schema ? 'type' then
    v_wanted := case jsonb_typeof(schema -> 'type')
      when 'array' then array(select jsonb_array_elements_text(schema -> 'type'))
      else array[schema ->> 'type'] end;
    if not (v_actual = any (v_wanted)
      or ('integer' = any (v_wanted) and v_actual = 'number' and value::numeric % 1 = 0)) then
      return format('%s: expected %s, got %s', path, array_to_string(v_wanted, ' or '),
        case when v_actual = 'number' and 'integer' = any (v_wanted) then 'a fraction' else v_actual end);
    end if;
  end if;
  if schema ? 'enum' and not exists (
    select 1 from jsonb_array_elements(schema -> 'enum') as e where e.value = schema_violation.value
  ) then
    return format('%s: %s is not one of %s', path, left(value::text, 60), left((schema -> 'enum')::text, 200));
  end if;
  if schema ? 'const' and schema -> 'const' <> value then
    return format('%s: expected %s, got %s', path, left((schema -> 'const')::text, 60), left(value::text, 60));
  end if;
  if jsonb_typeof(schema -> 'anyOf') = 'array' then
    v_first := null;
    for v_child in select e.value from jsonb_array_elements(schema -> 'anyOf') as e loop
      v_problem := pgflow.schema_violation(value, v_child, v_root, path);
      if v_problem is null then
        v_first := null;
        exit;
      end if;
      v_first := coalesce(v_first, v_problem);
    end loop;
    if v_first is not null then
      return format('%s: matches none of its %s choices (the first: %s)',
        path, jsonb_array_length(schema -> 'anyOf'), v_first);
    end if;
  end if;

  if v_actual = 'object' then
    for v_key in select jsonb_array_elements_text(coalesce(schema -> 'required', '[]')) loop
      if not value ? v_key then
        return format('%s: "%s" is required', path, v_key);
      end if;
    end loop;
    for v_key, v_child in select e.key, e.value from jsonb_each(value) as e order by e.key loop
      if schema -> 'properties' ? v_key then
        v_problem := pgflow.schema_violation(v_child, schema -> 'properties' -> v_key, v_root,
          path || case when v_key ~ '^[A-Za-z_][A-Za-z0-9_]*$' then '.' || v_key
            else '[' || to_jsonb(v_key)::text || ']' end);
      elsif schema -> 'additionalProperties' = 'false'::jsonb then
        v_problem := format('%s: "%s" is not a property it allows', path, v_key);
      elsif jsonb_typeof(schema -> 'additionalProperties') = 'object' then
        v_problem := pgflow.schema_violation(v_child, schema -> 'additionalProperties', v_root,
          path || '[' || to_jsonb(v_key)::text || ']');
      end if;
      if v_problem is not null then
        return v_problem;
      end if;
    end loop;
  elsif v_actual = 'array' and jsonb_typeof(schema -> 'items') = 'object' then
    v_index := 0;
    for v_child in select e.value from jsonb_array_elements(value) as e loop
      v_problem := pgflow.schema_violation(v_child, schema -> 'items', v_root, format('%s[%s]', path, v_index));
      if v_problem is not null then
        return v_problem;
      end if;
      v_index := v_index + 1;
    end loop;
  end if;
  return null;
end;
$$;

-- Appends a step routed to queue_name (its step_index is the next one) with its dependency edges,
-- after checking it. Idempotent: re-adding an identical step returns it, any difference is an
-- error, and a persisted route is never changed. The caller holds the definition lock and has
-- checked that the flow exists. Used by add_step and by the compilation of step-queued flows.
-- A signal step (step_type 'signal') runs no task; its timeout is how long it waits.
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
  if step_type is null or step_type not in ('single', 'map', 'signal') then
    raise exception 'Invalid step type "%" for step "%".', step_type, step_slug
      using errcode = '22023', hint = 'Use "single", "map" or "signal".';
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

-- Writes a complete flow definition from a shape in the given queue mode: the flow with
-- shape.options, every step in array order with its options and its route from queue_names (in
-- step order), then the queues (none for a signal step). Every queue name is checked before
-- anything is written (in flow mode by create_flow). Called by ensure_flow_compiled under the
-- definition lock, for a flow that does not exist.
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
    -- A signal step runs no task: its route is reserved, but it has no queue.
    for v_queue in
      select s.queue_name from pgflow.steps as s
      where s.flow_slug = _create_flow_from_shape.flow_slug and s.step_type <> 'signal'
      order by s.step_index
    loop
      perform pgmq.create(v_queue);
    end loop;
  end if;
end;
$$;

-- Rejects a malformed shape document with a clear error before anything is compared or written.
-- Called by ensure_flow_compiled.
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

-- Keeps the payload schemas of a flow's signal steps in step with the shape a worker or a
-- migration compiled it with: a step's "payloadSchema" replaces the stored one, and a signal step
-- the shape gives none (a hand-written shape) keeps its own. Not part of the compared shape.
-- Called by _adopt_flow_description under the flow's definition lock.
create function pgflow._store_payload_schemas(flow_slug text, shape jsonb)
returns void
language sql
volatile
set search_path = ''
as $$
  update pgflow.steps as s
  set payload_schema = e.step -> 'payloadSchema'
  from jsonb_array_elements(_store_payload_schemas.shape -> 'steps') as e (step)
  where s.flow_slug = _store_payload_schemas.flow_slug and s.step_slug = e.step ->> 'slug'
    and s.step_type = 'signal' and e.step ? 'payloadSchema'
    and s.payload_schema is distinct from e.step -> 'payloadSchema';
$$;

-- Adopts a shape's description (its "inputSchema", its options and its signal steps'
-- "payloadSchema"; see pgflow.flow_descriptions) for a flow, or keeps the stored one when the
-- shape's is older. The rule: a description the
-- database has never seen is newer and is adopted, and so is the current one again; one it has
-- seen but is not the current one is older, and is kept out, unless the caller adopts it
-- explicitly (a generated migration sets pgflow.adopt_description = on for its transaction) or
-- the database is local (pgflow.local = on: every worker's description is adopted, as in dev).
-- Returns {"kept": false, "optionsUpdated": [...]} or {"kept": true, "adoptedAt": <the stored
-- description's>}. Called by ensure_flow_compiled under the flow's definition lock.
create or replace function pgflow._adopt_flow_description(flow_slug text, shape jsonb)
returns jsonb
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_hash text := md5(jsonb_build_object(
    'inputSchema', shape -> 'inputSchema',
    'options', shape -> 'options',
    'steps', (
      select coalesce(jsonb_agg(jsonb_build_object('slug', e.step ->> 'slug', 'options', e.step -> 'options')
          -- Since engine 0011 a signal step's payload schema too (only when there is one, so
          -- that the descriptions of flows without signals hash as before).
          || case when e.step ? 'payloadSchema'
            then jsonb_build_object('payloadSchema', e.step -> 'payloadSchema') else '{}' end
        order by e.ord), '[]'::jsonb)
      from jsonb_array_elements(shape -> 'steps') with ordinality as e (step, ord)
    )
  )::text);
  v_current text;
  v_adopted_at timestamptz;
begin
  select d.description_hash, d.adopted_at into v_current, v_adopted_at
  from pgflow.flow_descriptions as d
  where d.flow_slug = _adopt_flow_description.flow_slug
  order by d.adopted_at desc, d.description_hash
  limit 1;
  if v_current is distinct from v_hash
    and exists (
      select 1 from pgflow.flow_descriptions as d
      where d.flow_slug = _adopt_flow_description.flow_slug and d.description_hash = v_hash
    )
    and coalesce(current_setting('pgflow.adopt_description', true), '') <> 'on'
    and coalesce(current_setting('pgflow.local', true), '') <> 'on'
  then
    return jsonb_build_object('kept', true, 'adoptedAt', v_adopted_at);
  end if;

  if v_current is distinct from v_hash then
    -- clock_timestamp: two adoptions in one transaction (a migration file with two versions of a
    -- flow) keep their order.
    insert into pgflow.flow_descriptions as d (flow_slug, description_hash, first_seen_at, adopted_at)
    values (_adopt_flow_description.flow_slug, v_hash, clock_timestamp(), clock_timestamp())
    on conflict on constraint flow_descriptions_pkey do update set adopted_at = excluded.adopted_at;
  end if;
  perform pgflow._store_input_schema(flow_slug, shape);
  perform pgflow._store_payload_schemas(flow_slug, shape);
  return jsonb_build_object('kept', false, 'optionsUpdated', pgflow._apply_flow_options(flow_slug, shape));
end;
$$;

-- Starts a run: one step state per step, then every ready step moves forward at once (conditions,
-- empty maps, first messages). A flow with a root map needs an array input. Returns the run.
-- Holds the flow's definition lock shared, so the definition cannot change while it is read.
-- With an idempotency_key, a run of this flow with that key is returned as it is (whatever its
-- input and status) and nothing starts; concurrent starts with one key make one run (the unique
-- index decides; under repeatable read the loser gets a serialization failure, to be retried).
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

-- Moves every ready step of a run (created, no remaining dependencies) forward, in step order:
-- evaluates its condition once, then skips it, fails the run, completes it at once when it has no
-- tasks, or starts it (tasks + one message each). A signal step completes with the signal it
-- received early, or starts waiting for one (no task, no message). Skips and instant completions
-- can ready more steps, so it repeats until a pass changes nothing but starts. A run that started
-- nothing may be finished, so then it tries to complete it.
-- Returns false when the run failed. Caller holds the run row lock.
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

-- Pauses a step of a flow: from now on no task of it starts, in any run and in either queue mode
-- (claims hold its messages, which use no attempt); tasks already started finish; the other steps
-- go on. Pausing a paused step keeps its paused_at and takes the new reason. Returns the pause.
-- A signal step runs no task and cannot be paused (engine 0011).
create or replace function pgflow.pause_step(flow_slug text, step_slug text, reason text default null)
returns pgflow.step_pauses
language plpgsql
volatile
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
  return v_pause;
end;
$$;

-- The five-argument fail_task goes: with both, a call with five arguments would be ambiguous.
drop function pgflow.fail_task(uuid, text, int, text, int);

-- A worker reports a task's failure. With attempts left the task is queued again and its message
-- hidden for base_delay * 2^attempts seconds; exhausted (or parked by stall recovery),
-- when_exhausted decides: fail the run, skip the step, or skip it and everything downstream.
-- Locks run, step state and task (in that order, in one statement), then PGMQ rows.
-- Late callbacks change nothing, and so does a stale one (`attempt`, from claim_tasks, is not the
-- task's current attempt): the task's row comes back unchanged, a stale one's attempts_count
-- differing from `attempt`. A failure with a `permanent_reason` (engine 0011) is not retried,
-- whatever attempts are left; the stored error gets a second line that says so and why.
create function pgflow.fail_task(
  run_id uuid, step_slug text, task_index int, error_message text, attempt int,
  permanent_reason text default null
)
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
  v_note text;
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

-- Retries a failed run from where it failed. Its failed steps, and the steps it left unfinished
-- when it failed, run again: every task of theirs that did not complete (it failed, or the
-- failure cancelled it) is queued again with a fresh message and no attempt used, keeping its
-- last error; completed tasks and steps keep their outputs and do not run again (in a map only
-- the failed and unfinished elements run); skipped steps stay skipped. A step that failed without
-- a task (a condition with when_unmet = fail, a signal that did not come) is ready again and
-- decided anew, and a signal step that waits starts a new wait. The run is started again
-- (retry_count + 1, retried_at); one event, run:retried.
-- Refused, changing nothing: an unknown run (P0002), a run that is not failed, or one whose flow
-- has gained a step since it started (55000). Locks the run, its step states and its tasks, in
-- that order, as every callback does; then it sends the new messages.
create function pgflow.retry_run(run_id uuid)
returns pgflow.runs
language plpgsql
volatile
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
      and t.status in ('failed', 'cancelled')
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
      set status = 'queued', message_id = v_sent.msg_id, attempts_count = 0, queued_at = clock_timestamp(),
        started_at = null, failed_at = null, output = null, last_worker_id = null, requeued_count = 0,
        last_requeued_at = null, permanently_stalled_at = null, claimed_timeout = null, lease_renewed_at = null
      where t.run_id = retry_run.run_id and t.step_slug = v_sent.step_slug and t.task_index = v_sent.task_index;
    end loop;
  end loop;

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
  -- Steps ready but never started when the run failed, and the ones made ready above.
  perform pgflow._advance_run(run_id);

  select * into v_run from pgflow.runs as r where r.run_id = retry_run.run_id;
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
create function pgflow.send_signal(run_id uuid, step_slug text, payload jsonb)
returns pgflow.signals
language plpgsql
volatile
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
  if v_state.status = 'started' then
    perform pgflow._complete_step(run_id, step_slug, payload);
    perform pgflow._advance_run(run_id);
  end if;
  return v_signal;
end;
$$;

-- Ends the waits that ran out: a signal step that has waited longer than its timeout (opt_timeout
-- seconds; null waits for ever) fails, and its run with it (when_exhausted = fail), or is skipped
-- with skip_reason signal_timed_out (skip, skip-cascade) and its run moves on. A run locked by
-- someone else right now is left for the next sweep. Returns how many steps it ended.
-- Called by requeue_stalled_tasks, which one worker at a time runs every sweep interval.
-- Locks each run, then its step state, as every callback does.
create function pgflow._expire_signal_steps()
returns int
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_wait record;
  v_message text;
  v_count int := 0;
begin
  for v_wait in
    select ss.run_id, ss.step_slug, s.opt_timeout, s.when_exhausted
    from pgflow.steps as s
    join pgflow.step_states as ss on ss.flow_slug = s.flow_slug and ss.step_slug = s.step_slug
    where s.step_type = 'signal' and s.opt_timeout is not null and ss.status = 'started'
      and ss.started_at + make_interval(secs => s.opt_timeout) <= clock_timestamp()
    order by ss.run_id, ss.step_slug
  loop
    perform 1 from pgflow.runs as r
    where r.run_id = v_wait.run_id and r.status = 'started'
    for update skip locked;
    continue when not found;
    -- GUARD: re-read under the run's lock: a signal may have come meanwhile.
    perform 1 from pgflow.step_states as ss
    where ss.run_id = v_wait.run_id and ss.step_slug = v_wait.step_slug and ss.status = 'started'
    for update;
    continue when not found;

    v_message := format('No signal came within %s s, the step''s timeout.', v_wait.opt_timeout);
    if v_wait.when_exhausted = 'fail' then
      update pgflow.step_states as ss
      set status = 'failed', failed_at = clock_timestamp(), remaining_tasks = null, error_message = v_message
      where ss.run_id = v_wait.run_id and ss.step_slug = v_wait.step_slug;
      perform pgflow._emit_event(v_wait.run_id, 'step:failed', v_wait.step_slug, 'failed');
      perform pgflow._fail_run(v_wait.run_id);
    else
      if v_wait.when_exhausted = 'skip' then
        perform pgflow._skip_step(v_wait.run_id, v_wait.step_slug, 'signal_timed_out', v_message);
      else
        perform pgflow._skip_step_cascade(v_wait.run_id, v_wait.step_slug, 'signal_timed_out', v_message);
      end if;
      perform pgflow._advance_run(v_wait.run_id);
    end if;
    v_count := v_count + 1;
  end loop;
  return v_count;
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
    perform pgflow.set_vt_batch(v_queue, v_ids, array_fill(0, array[cardinality(v_ids)]));
  end loop;
  perform pgflow._archive_task_messages(v_park_queues, v_park_messages);
  return coalesce(cardinality(v_requeue_messages), 0);
end;
$$;

-- Which queue routes have a live worker right now: every persisted step route, left-joined to the
-- workers registered on exactly that queue that are neither stopped nor deprecated and sent a
-- heartbeat within `freshness` (default: the liveness rule's live_within, 15 s, three heartbeats).
-- Several live instances are one covered route. A point-in-time check, run after a deployment.
-- Signal steps are left out: they run no task, so no worker serves them.
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
  where s.step_type <> 'signal'
  group by s.flow_slug, s.step_slug, s.step_index, s.queue_name
  order by s.flow_slug, s.step_index
$$;

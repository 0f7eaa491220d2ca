-- Appends a step routed to queue_name (its step_index is the next one) with its dependency edges,
-- after checking it. Idempotent: re-adding an identical step returns it, any difference is an
-- error, and a persisted route is never changed. The caller holds the definition lock and has
-- checked that the flow exists. Used by add_step and by the compilation of step-queued flows.
-- A signal step (step_type 'signal') runs no task; its timeout is how long it waits.
-- A subflow step (engine 0028: step_type 'subflow', or a 'map' with a subflow_slug) starts runs of
-- the flow subflow_slug names; the flow need not exist yet (flows are applied in any order), but
-- it is not this flow.
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

-- Appends a step routed to queue_name (its step_index is the next one) with its dependency edges,
-- after checking it. Idempotent: re-adding an identical step returns it, any difference is an
-- error, and a persisted route is never changed. The caller holds the definition lock and has
-- checked that the flow exists. Used by add_step and by the compilation of step-queued flows.
-- A signal step (step_type 'signal') runs no task; its timeout is how long it waits.
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

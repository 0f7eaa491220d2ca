-- Keeps a flow's options (retries, delays, timeouts) in step with the shape it was verified
-- against: options are not part of the compared shape, so an edited spec changes them in place,
-- with no recompile. A shape without top-level "options" (a hand-written one) changes no option,
-- the steps' neither; otherwise a step without an option inherits the flow's. Returns the changes, [{"step": null | slug, "option",
-- "from", "to"}] (null: the flow's default), and notifies them on the channel pgflow_flows. Tasks
-- claimed before keep the timeout of their claim. Since engine 0017 a step's options may hold its
-- limits (maxInFlight, rateLimit, ratePeriod): since engine 0023 they are the step's baseline
-- (opt_max_in_flight, opt_rate_limit, opt_rate_period) and pgflow.step_limits takes them unless an
-- operator's override stands (pgflow.step_limit_overrides), which stays; a change under one
-- carries "override", the override's value. Since engine 0018 a step's options may hold its concurrency key
-- (concurrencyKey, a JSON path into the run's input, and concurrencyLimit, the tasks of one key
-- that may hold a message at once): new tasks take them; tasks parked before keep their key and
-- take the new limit. Called by _adopt_flow_description under the flow's definition lock.
create function pgflow._apply_flow_options(flow_slug text, shape jsonb)
returns jsonb
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_flow jsonb := shape -> 'options';
  v_changes jsonb;
begin
  if v_flow is null or jsonb_typeof(v_flow) <> 'object' then
    return '[]'::jsonb;
  end if;

  with wanted as (
    -- The flow's options (an option the shape leaves out stays as it is), then every step's.
    select null::text as step_slug, -1 as step_index, o.option, o.ord, o.current, coalesce(o.wanted, o.current) as wanted,
      null::jsonb as extra
    from pgflow.flows as f,
      unnest(
        array['maxAttempts', 'baseDelay', 'timeout'],
        array[f.opt_max_attempts, f.opt_base_delay, f.opt_timeout],
        array[(v_flow ->> 'maxAttempts')::int, (v_flow ->> 'baseDelay')::int, (v_flow ->> 'timeout')::int]
      ) with ordinality as o (option, current, wanted, ord)
    where f.flow_slug = _apply_flow_options.flow_slug
    union all
    select s.step_slug, s.step_index, o.option, o.ord, o.current, o.wanted, null::jsonb
    from jsonb_array_elements(shape -> 'steps') as e (step)
    join pgflow.steps as s on s.flow_slug = _apply_flow_options.flow_slug and s.step_slug = e.step ->> 'slug',
      unnest(
        array['maxAttempts', 'baseDelay', 'timeout', 'startDelay'],
        array[s.opt_max_attempts, s.opt_base_delay, s.opt_timeout, s.opt_start_delay],
        array[(e.step #>> '{options,maxAttempts}')::int, (e.step #>> '{options,baseDelay}')::int,
              (e.step #>> '{options,timeout}')::int, (e.step #>> '{options,startDelay}')::int]
      ) with ordinality as o (option, current, wanted, ord)
  ),
  limited as (
    -- Limits: the spec's baseline is exactly what it declares (none where it declares none); an
    -- operator's override stays over it, and the change says which value it keeps.
    select s.step_slug, s.step_index, o.option, 4 + o.ord as ord, o.current, o.declared as wanted,
      case when v.flow_slug is not null then jsonb_build_object('override', o.overriding) end as extra
    from jsonb_array_elements(shape -> 'steps') as e (step)
    join pgflow.steps as s on s.flow_slug = _apply_flow_options.flow_slug and s.step_slug = e.step ->> 'slug'
    left join pgflow.step_limit_overrides as v on v.flow_slug = s.flow_slug and v.step_slug = s.step_slug,
      unnest(
        array['maxInFlight', 'rateLimit', 'ratePeriod'],
        array[s.opt_max_in_flight, s.opt_rate_limit, s.opt_rate_period],
        array[(e.step #>> '{options,maxInFlight}')::int, (e.step #>> '{options,rateLimit}')::int,
              (e.step #>> '{options,ratePeriod}')::int],
        array[v.max_in_flight, v.rate_limit, v.rate_period_s]
      ) with ordinality as o (option, current, declared, overriding, ord)
  ),
  keyed as (
    -- A step's concurrency key and its limit per key (engine 0018): the spec's, or none.
    select s.step_slug, s.step_index, o.option, 7 + o.ord as ord, o.current, o.wanted, null::jsonb
    from jsonb_array_elements(shape -> 'steps') as e (step)
    join pgflow.steps as s on s.flow_slug = _apply_flow_options.flow_slug and s.step_slug = e.step ->> 'slug',
      unnest(
        array['concurrencyKey', 'concurrencyLimit'],
        array[to_jsonb(s.opt_concurrency_key), to_jsonb(s.opt_concurrency_limit)],
        array[nullif(e.step #> '{options,concurrencyKey}', 'null'),
              nullif(e.step #> '{options,concurrencyLimit}', 'null')]
      ) with ordinality as o (option, current, wanted, ord)
  )
  select jsonb_agg(jsonb_build_object('step', w.step_slug, 'option', w.option, 'from', w.current, 'to', w.wanted)
      || coalesce(w.extra, '{}'::jsonb) order by w.step_index, w.ord)
  into v_changes
  from (
    select w.step_slug, w.step_index, w.option, w.ord, to_jsonb(w.current) as current,
      to_jsonb(w.wanted) as wanted, w.extra
    from wanted as w
    union all
    select l.step_slug, l.step_index, l.option, l.ord, to_jsonb(l.current), to_jsonb(l.wanted), l.extra
    from limited as l
    union all
    select * from keyed
  ) as w
  where w.current is distinct from w.wanted;

  if v_changes is null then
    return '[]'::jsonb;
  end if;

  update pgflow.flows as f
  set opt_max_attempts = coalesce((v_flow ->> 'maxAttempts')::int, f.opt_max_attempts),
    opt_base_delay = coalesce((v_flow ->> 'baseDelay')::int, f.opt_base_delay),
    opt_timeout = coalesce((v_flow ->> 'timeout')::int, f.opt_timeout)
  where f.flow_slug = _apply_flow_options.flow_slug;
  update pgflow.steps as s
  set opt_max_attempts = (e.step #>> '{options,maxAttempts}')::int,
    opt_base_delay = (e.step #>> '{options,baseDelay}')::int,
    opt_timeout = (e.step #>> '{options,timeout}')::int,
    opt_start_delay = (e.step #>> '{options,startDelay}')::int,
    opt_concurrency_key = e.step #>> '{options,concurrencyKey}',
    opt_concurrency_limit = (e.step #>> '{options,concurrencyLimit}')::int,
    opt_max_in_flight = (e.step #>> '{options,maxInFlight}')::int,
    opt_rate_limit = (e.step #>> '{options,rateLimit}')::int,
    opt_rate_period = (e.step #>> '{options,ratePeriod}')::int
  from jsonb_array_elements(shape -> 'steps') as e (step)
  where s.flow_slug = _apply_flow_options.flow_slug and s.step_slug = e.step ->> 'slug';
  -- The keys of a step whose limit per key changed are settled anew when this commits: their
  -- parked tasks take the room a higher limit (or none) gives.
  insert into pgflow.concurrency_events (flow_slug, step_slug, concurrency_key, parked)
  select k.flow_slug, k.step_slug, k.concurrency_key, true
  from pgflow.concurrency_keys as k
  where k.flow_slug = _apply_flow_options.flow_slug and k.step_slug in (
    select x ->> 'step' from jsonb_array_elements(v_changes) as x
    where x ->> 'option' in ('concurrencyKey', 'concurrencyLimit')
  );
  if found then
    perform set_config('pgflow.concurrency_events', 'pending', true);
  end if;
  -- The steps' rows are locked by the update above: set_step_limits waits, so the override
  -- seen here is the one that stands.
  perform pgflow._put_step_limits(s.flow_slug, s.step_slug, s.opt_max_in_flight, s.opt_rate_limit,
    s.opt_rate_period, 'spec')
  from pgflow.steps as s
  where s.flow_slug = _apply_flow_options.flow_slug
    and s.step_slug in (select x ->> 'step' from jsonb_array_elements(v_changes) as x
                        where x ->> 'option' in ('maxInFlight', 'rateLimit', 'ratePeriod'))
    and not exists (select 1 from pgflow.step_limit_overrides as v
                    where v.flow_slug = s.flow_slug and v.step_slug = s.step_slug);

  perform pg_notify('pgflow_flows', jsonb_build_object(
    'event', 'flow:options_updated', 'flow_slug', flow_slug, 'changes', v_changes
  )::text);
  return v_changes;
end;
$$;

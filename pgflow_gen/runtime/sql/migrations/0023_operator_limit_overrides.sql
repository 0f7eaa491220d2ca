-- Engine migration 0023: an operator's step limits are an override that stays until reset.
--
-- Until 0022 the next worker start (or `db apply`) put a step's limits back to the spec's, so an
-- emergency throttle set with `pgflow-gen limits` vanished at the next deploy or `dev` restart.
-- Now the spec's limits are each step's baseline (steps.opt_max_in_flight, opt_rate_limit,
-- opt_rate_period), an operator's are an override (pgflow.step_limit_overrides) that worker
-- starts and migrations keep, and pgflow.reset_step_limits gives the step back the spec's.
-- step_limit_usage reports both (new columns: its result changes, so it is created again);
-- a change of the baseline under an override says which value stays.
--
-- Data: limits the spec set become the baselines; limits an operator set become overrides (by
-- the role of the last 'limits' action on the step).

-- BEGIN HAND-WRITTEN: tables and data, applied before the functions below.
alter table pgflow.steps
  add column opt_max_in_flight int,
  add column opt_rate_limit int,
  add column opt_rate_period int,
  add constraint opt_limits_are_whole check (
    coalesce(opt_max_in_flight, 1) >= 1 and coalesce(opt_rate_limit, 1) >= 1
    and coalesce(opt_rate_period, 1) >= 1 and (opt_rate_limit is null) = (opt_rate_period is null)
  );

create table pgflow.step_limit_overrides (
  flow_slug text not null,
  step_slug text not null,
  max_in_flight int,
  rate_limit int,
  rate_period_s int,
  set_at timestamptz not null default now(),
  actor text not null default session_user,
  label text,
  primary key (flow_slug, step_slug),
  foreign key (flow_slug, step_slug) references pgflow.steps (flow_slug, step_slug) on delete cascade,
  constraint step_limit_overrides_are_whole check (
    coalesce(max_in_flight, 1) >= 1 and coalesce(rate_limit, 1) >= 1 and coalesce(rate_period_s, 1) >= 1
    and (rate_limit is null) = (rate_period_s is null)
  )
);

update pgflow.steps as s
set opt_max_in_flight = l.max_in_flight, opt_rate_limit = l.rate_limit, opt_rate_period = l.rate_period_s
from pgflow.step_limits as l
where l.flow_slug = s.flow_slug and l.step_slug = s.step_slug and l.set_by = 'spec';

insert into pgflow.step_limit_overrides as o
  (flow_slug, step_slug, max_in_flight, rate_limit, rate_period_s, set_at, actor, label)
select l.flow_slug, l.step_slug, l.max_in_flight, l.rate_limit, l.rate_period_s, l.updated_at,
  coalesce(a.actor, session_user), a.label
from pgflow.step_limits as l
left join lateral (
  select x.actor, x.label from pgflow.operator_actions as x
  where x.action = 'limits' and x.flow_slug = l.flow_slug and x.step_slug = l.step_slug
  order by x.acted_at desc limit 1
) as a on true
where l.set_by = 'operator';
-- END HAND-WRITTEN

-- Written by `make migration` from pgflow_gen/runtime/sql/source/: edit the source, then
-- write the migration again; only the header and the hand-written section above are kept.

-- pgflow.ensure_flow_compiled: source/0118_function_ensure_flow_compiled.sql
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
        select string_agg(format('%s %s %s -> %s%s',
            case when c ->> 'step' is null then 'flow' else format('step "%s"', c ->> 'step') end,
            c ->> 'option', coalesce(c ->> 'from', n.unset), coalesce(c ->> 'to', n.unset),
            case when c ? 'override' then format(' (an operator''s %s stays until `pgflow-gen limits %s %s --reset`)',
              coalesce(c ->> 'override', 'none'), flow_slug, c ->> 'step') else '' end),
          ', ' order by o)
        from jsonb_array_elements(v_options) with ordinality as x (c, o),
          -- An unset option is the flow's; an unset limit or key is none.
          lateral (select case when c ->> 'step' is not null and c ->> 'option' in ('maxInFlight',
            'rateLimit', 'ratePeriod', 'concurrencyKey', 'concurrencyLimit') then 'none'
            else 'the flow''s' end) as n (unset)
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

-- pgflow._apply_flow_options: source/0132_function_apply_flow_options.sql
create or replace function pgflow._apply_flow_options(flow_slug text, shape jsonb)
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

-- pgflow.step_limit_usage: source/0171_function_step_limit_usage.sql
drop function pgflow.step_limit_usage(text);
create or replace function pgflow.step_limit_usage(flow_slug text default null)
returns table (
  flow_slug text,
  step_slug text,
  queue_name text,
  max_in_flight int,
  rate_limit int,
  rate_period_s int,
  set_by text,
  in_flight bigint,
  window_starts bigint,
  updated_at timestamptz,
  spec_max_in_flight int,
  spec_rate_limit int,
  spec_rate_period_s int,
  overridden_at timestamptz,
  overridden_by text
)
language sql
stable
security definer
set search_path = ''
as $$
  select s.flow_slug, s.step_slug, s.queue_name, l.max_in_flight, l.rate_limit, l.rate_period_s,
    case when v.flow_slug is not null then 'operator' else l.set_by end,
    (select count(*) from pgflow.step_slots as x
     join pgflow.step_tasks as t on t.run_id = x.run_id and t.step_slug = x.step_slug
       and t.task_index = x.task_index
     where x.flow_slug = s.flow_slug and x.step_slug = s.step_slug
       and t.status = 'started' and t.attempts_count = x.attempt),
    (select count(*) from pgflow.step_slots as x
     where x.flow_slug = s.flow_slug and x.step_slug = s.step_slug and l.rate_period_s is not null
       and x.started_at > now() - make_interval(secs => l.rate_period_s)),
    coalesce(l.updated_at, v.set_at),
    s.opt_max_in_flight, s.opt_rate_limit, s.opt_rate_period, v.set_at, v.actor
  from pgflow.steps as s
  left join pgflow.step_limits as l on l.flow_slug = s.flow_slug and l.step_slug = s.step_slug
  left join pgflow.step_limit_overrides as v on v.flow_slug = s.flow_slug and v.step_slug = s.step_slug
  where (l.flow_slug is not null or v.flow_slug is not null)
    and (step_limit_usage.flow_slug is null or s.flow_slug = step_limit_usage.flow_slug)
  order by s.flow_slug, s.step_index;
$$;

-- pgflow.reset_step_limits: source/0205_function_reset_step_limits.sql
create function pgflow.reset_step_limits(flow_slug text, step_slug text)
returns pgflow.step_limits
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_step pgflow.steps;
  v_override pgflow.step_limit_overrides;
  v_limits pgflow.step_limits;
begin
  perform pgflow._require_step(flow_slug, step_slug);
  perform 1 from pgflow.steps as s
  where s.flow_slug = reset_step_limits.flow_slug and s.step_slug = reset_step_limits.step_slug
  for no key update;
  delete from pgflow.step_limit_overrides as o
  where o.flow_slug = reset_step_limits.flow_slug and o.step_slug = reset_step_limits.step_slug
  returning * into v_override;
  if v_override.flow_slug is not null then
    select * into v_step from pgflow.steps as s
    where s.flow_slug = reset_step_limits.flow_slug and s.step_slug = reset_step_limits.step_slug;
    perform pgflow._put_step_limits(flow_slug, step_slug, v_step.opt_max_in_flight,
      v_step.opt_rate_limit, v_step.opt_rate_period, 'spec');
  end if;
  select * into v_limits from pgflow.step_limits as l
  where l.flow_slug = reset_step_limits.flow_slug and l.step_slug = reset_step_limits.step_slug;
  perform pgflow._record_action('reset_limits', flow_slug, null, step_slug, jsonb_build_object(
    'removed', case when v_override.flow_slug is not null then jsonb_build_object(
      'max_in_flight', v_override.max_in_flight, 'rate_limit', v_override.rate_limit,
      'rate_period_s', v_override.rate_period_s) end));
  if v_limits.flow_slug is null then
    return null;
  end if;
  return v_limits;
end;
$$;
-- No engine function runs for PUBLIC (engine 0019), those above included.
revoke execute on all functions in schema pgflow from public;

-- Engine migration 0024: the signal sweep reads the runs under way, not every signal step's
-- history; ensure_flow_compiled's summary counts its noun.
--
-- pgflow._expire_signal_steps (run by each stall sweep, every 15 s per flow's workers) read the
-- states of every signal step through the steps' index, finished runs' included: 12 ms at
-- 100,000 finished runs of a flow with a signal step (benchmarks/maintenance.py). It now starts
-- from the runs under way (the runs' status index), so its cost follows the work in flight.
-- pgflow.ensure_flow_compiled says "recompiled: 1 run deleted" ("3 runs"), not "1 run(s)".
-- No table changes; both functions keep their signatures and results otherwise.

-- BEGIN HAND-WRITTEN: tables and data, applied before the functions below.
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
      'summary', format('recompiled: %s %s deleted', v_deleted_runs,
        case when v_deleted_runs = 1 then 'run' else 'runs' end));
  end if;
  return jsonb_build_object('status', 'mismatch', 'mismatchKind', v_kind,
    'differences', to_jsonb(v_differences));
end;
$$;

-- pgflow._expire_signal_steps: source/0148_function_expire_signal_steps.sql
create or replace function pgflow._expire_signal_steps()
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
    -- From the runs under way (engine 0024): the runs' status index finds them, so a long
    -- history costs nothing here (reading the signal steps' states first read every finished
    -- run's, 12 ms at 100,000 finished runs; 0.4 ms now).
    select ss.run_id, ss.step_slug, s.opt_timeout, s.when_exhausted
    from pgflow.runs as r
    join pgflow.step_states as ss on ss.run_id = r.run_id
    join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    where r.status = 'started'
      and s.step_type = 'signal' and s.opt_timeout is not null and ss.status = 'started'
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
-- No engine function runs for PUBLIC (engine 0019), those above included.
revoke execute on all functions in schema pgflow from public;

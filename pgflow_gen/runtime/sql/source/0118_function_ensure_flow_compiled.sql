-- Startup compilation: creates a missing flow from its shape in its queue mode, verifies an
-- existing one (shape, then queue mode and the persisted route of every step), and on a
-- difference recompiles only in a local database (pgflow.local = on), else reports a mismatch of
-- kind "shape" or "routing" and changes nothing. The engine derives the routes itself: a supplied
-- route_map ([{stepSlug, queueName}] in step order) must be exactly the derived one (required in
-- step mode). A shape's description (its "inputSchema" and options: not compared) is adopted
-- when the flow is compiled or recompiled, and when it is verified unless the description is an
-- older one (_adopt_flow_description: "descriptionKept"); "optionsUpdated" lists the options it
-- changed. A result may carry a "summary" for people: what changed ("verified; options updated:
-- ...", "recompiled: 6 runs deleted", "verified; kept the options and input schema adopted
-- at ...").
-- A recompile keeps the flow's table triggers (engine 0032).
-- Takes the flow's definition lock; any failure rolls back everything. An admin's function (it
-- writes definitions); a worker without it verifies (pgflow.verify_flow_compiled).
create function pgflow.ensure_flow_compiled(
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
  v_triggers jsonb;
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
    -- The flow's table triggers stay through the recompile (engine 0032): their rows are set
    -- aside, so that deleting the flow leaves its database triggers, then put back.
    with gone as (
      delete from pgflow.flow_triggers as t where t.flow_slug = ensure_flow_compiled.flow_slug
      returning to_jsonb(t) as t
    )
    select jsonb_agg(g.t) into v_triggers from gone as g;
    perform pgflow.delete_flow_and_data(flow_slug);
    perform pgflow._create_flow_from_shape(flow_slug, shape, queue_mode, v_queues);
    insert into pgflow.flow_triggers
    select * from jsonb_populate_recordset(null::pgflow.flow_triggers, v_triggers);
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

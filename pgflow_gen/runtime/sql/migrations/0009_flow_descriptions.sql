-- Engine migration 0009: a flow's description follows the newest spec, never an older one.
--
-- A flow's description is what its spec says beyond the compared shape: the run input's schema
-- and the flow's and steps' options. Until 0008 every verification replaced them (the last
-- writer won), so an old worker started during a rollback, or still running through a rolling
-- deploy, put back an older input schema and older timeouts. pgflow.flow_descriptions lists the
-- descriptions a flow has been given, by content hash; ensure_flow_compiled adopts one it has
-- never seen (a newer spec) or the current one, and keeps the stored one when a shape's is listed
-- but not current (an older spec: "descriptionKept", and a summary saying so). A generated
-- migration adopts its description even when it is listed (it sets pgflow.adopt_description = on
-- for its transaction), so applying the migrations of a reverted spec restores it; on a local
-- database (pgflow.local = on) every description is adopted, as before. Flows compiled before
-- this migration have no listed description: their next verification adopts one.
--
-- Workers of any release run on it.

-- The descriptions a flow has been given, by content: a description is the part of a spec that
-- is not its compared shape (the run input's schema, the flow's and the steps' options), hashed
-- with md5 over its jsonb text. The row adopted last is the one pgflow.flows and pgflow.steps
-- hold. A worker whose description is listed but not the latest is an older one (started during
-- a rollback, or still running through a rolling deploy) and changes nothing; see
-- _adopt_flow_description for who may adopt one again.
create table pgflow.flow_descriptions (
  flow_slug text not null references pgflow.flows (flow_slug) on delete cascade,
  description_hash text not null,
  first_seen_at timestamptz not null default now(),
  adopted_at timestamptz not null default now(),
  primary key (flow_slug, description_hash)
);

-- Adopts a shape's description (its "inputSchema" and its options; see pgflow.flow_descriptions)
-- for a flow, or keeps the stored one when the shape's is older. The rule: a description the
-- database has never seen is newer and is adopted, and so is the current one again; one it has
-- seen but is not the current one is older, and is kept out, unless the caller adopts it
-- explicitly (a generated migration sets pgflow.adopt_description = on for its transaction) or
-- the database is local (pgflow.local = on: every worker's description is adopted, as in dev).
-- Returns {"kept": false, "optionsUpdated": [...]} or {"kept": true, "adoptedAt": <the stored
-- description's>}. Called by ensure_flow_compiled under the flow's definition lock.
create function pgflow._adopt_flow_description(flow_slug text, shape jsonb)
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
  return jsonb_build_object('kept', false, 'optionsUpdated', pgflow._apply_flow_options(flow_slug, shape));
end;
$$;

-- Startup compilation: creates a missing flow from its shape in its queue mode, verifies an
-- existing one (shape, then queue mode and the persisted route of every step), and on a
-- difference recompiles only in a local database (pgflow.local = on), else reports a mismatch of
-- kind "shape" or "routing" and changes nothing. The engine derives the routes itself: a supplied
-- route_map ([{stepSlug, queueName}] in step order) must be exactly the derived one (required in
-- step mode). A shape's description (its "inputSchema" and options: not compared) is adopted
-- when the flow is compiled or recompiled, and when it is verified unless the description is an
-- older one (_adopt_flow_description: "descriptionKept"); "optionsUpdated" lists the options it
-- changed. A result may carry a "summary" for people: what changed ("verified; options updated:
-- ...", "recompiled: 6 run(s) deleted", "verified; kept the options and input schema adopted
-- at ...").
-- Takes the flow's definition lock; any failure rolls back everything.
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
  v_description jsonb;
  v_options jsonb;
  v_deleted_runs bigint;
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
    perform pgflow._adopt_flow_description(flow_slug, shape);
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
        select string_agg(format('%s %s %s -> %s',
            case when c ->> 'step' is null then 'flow' else format('step "%s"', c ->> 'step') end,
            c ->> 'option', coalesce(c ->> 'from', 'the flow''s'), coalesce(c ->> 'to', 'the flow''s')),
          ', ' order by o)
        from jsonb_array_elements(v_options) with ordinality as x (c, o)
      ));
  end if;
  v_kind := case when cardinality(v_differences) > 0 then 'shape' else 'routing' end;
  v_differences := v_differences || v_routing;

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

-- Adopts a shape's description (its "inputSchema", its options, its signal steps'
-- "payloadSchema" and, since engine 0017, its "schedules"; see pgflow.flow_descriptions) for a
-- flow, or keeps the stored one when the shape's is older. The rule: a description the
-- database has never seen is newer and is adopted, and so is the current one again; one it has
-- seen but is not the current one is older, and is kept out, unless the caller adopts it
-- explicitly (a generated migration sets pgflow.adopt_description = on for its transaction) or
-- the database is local (pgflow.local = on: every worker's description is adopted, as in dev).
-- Returns {"kept": false, "optionsUpdated": [...], "schedulesUpdated": [...]} or {"kept": true,
-- "adoptedAt": <the stored description's>}. Called by ensure_flow_compiled under the flow's
-- definition lock.
create function pgflow._adopt_flow_description(flow_slug text, shape jsonb)
returns jsonb
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_hash text := md5((jsonb_build_object(
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
  -- Since engine 0017 its schedules too (only when it has some, so that the descriptions of
  -- flows without schedules hash as before).
  ) || case when shape ? 'schedules' then jsonb_build_object('schedules', shape -> 'schedules') else '{}' end
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
  return jsonb_build_object('kept', false, 'optionsUpdated', pgflow._apply_flow_options(flow_slug, shape),
    'schedulesUpdated', pgflow._store_schedules(flow_slug, shape));
end;
$$;

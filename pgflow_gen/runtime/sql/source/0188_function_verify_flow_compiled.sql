-- Startup verification for a worker that may not compile (engine 0019: pgflow.ensure_flow_compiled
-- is an admin's): the same checks and the same result as ensure_flow_compiled, with status
-- "verified", "mismatch" (mismatchKind "shape" or "routing", and the differences) or "missing"
-- (the flow is not compiled: an admin applies its migration). Adopts no description and changes
-- nothing, whatever pgflow.local says. No locks.
create function pgflow.verify_flow_compiled(
  flow_slug text,
  shape jsonb,
  queue_mode text default 'flow',
  route_map jsonb default null
)
returns jsonb
language plpgsql
stable
security definer
set search_path = ''
as $$
declare
  v_derived jsonb;
  v_differences text[];
  v_kind text;
begin
  select c.derived into v_derived
  from pgflow._check_flow_definition(flow_slug, shape, queue_mode, route_map) as c;
  if not exists (select 1 from pgflow.flows as f where f.flow_slug = verify_flow_compiled.flow_slug) then
    return jsonb_build_object('status', 'missing', 'mismatchKind', null, 'differences', '[]'::jsonb);
  end if;
  select d.kind, d.differences into v_kind, v_differences
  from pgflow._flow_differences(flow_slug, shape, queue_mode, v_derived) as d;
  return jsonb_build_object('status', case when v_kind is null then 'verified' else 'mismatch' end,
    'mismatchKind', v_kind, 'differences', to_jsonb(v_differences));
end;
$$;

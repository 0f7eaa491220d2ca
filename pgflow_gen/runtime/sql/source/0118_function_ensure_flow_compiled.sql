-- Startup compilation: creates a missing flow from its shape, verifies an existing one, and on a
-- structural difference recompiles only in a local database (pgflow.local = on), else reports a
-- mismatch and changes nothing. Takes the flow's definition lock.
create function pgflow.ensure_flow_compiled(flow_slug text, shape jsonb)
returns jsonb
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_differences text[];
begin
  perform pgflow._validate_flow_shape(shape);
  perform pgflow._lock_flow_definition(flow_slug);

  if not exists (select 1 from pgflow.flows as f where f.flow_slug = ensure_flow_compiled.flow_slug) then
    perform pgflow._create_flow_from_shape(flow_slug, shape);
    return jsonb_build_object('status', 'compiled', 'mismatchKind', null, 'differences', '[]'::jsonb);
  end if;

  v_differences := pgflow._compare_flow_shapes(
    pgflow._normalize_flow_shape(shape), pgflow._get_flow_shape(flow_slug)
  );
  if cardinality(v_differences) = 0 then
    return jsonb_build_object('status', 'verified', 'mismatchKind', null, 'differences', '[]'::jsonb);
  end if;

  if coalesce(current_setting('pgflow.local', true), '') = 'on' then
    perform pgflow.delete_flow_and_data(flow_slug);
    perform pgflow._create_flow_from_shape(flow_slug, shape);
    return jsonb_build_object('status', 'recompiled', 'mismatchKind', 'shape',
      'differences', to_jsonb(v_differences));
  end if;
  return jsonb_build_object('status', 'mismatch', 'mismatchKind', 'shape',
    'differences', to_jsonb(v_differences));
end;
$$;

-- How a compiled flow differs from a definition: the shape (kind "shape"), else the queue mode and
-- the persisted route of every step (kind "routing"; compared even when the shape matches: a
-- changed resolver or a manual edit), with a line per difference. A null kind: it matches. The flow
-- must exist. No writes, no locks. Called by ensure_flow_compiled and verify_flow_compiled.
create function pgflow._flow_differences(
  flow_slug text,
  shape jsonb,
  queue_mode text,
  derived jsonb,
  out kind text,
  out differences text[]
)
language plpgsql
stable
set search_path = ''
as $$
declare
  v_mode text;
  v_persisted jsonb;
  v_routing text[] := '{}';
begin
  differences := pgflow._compare_flow_shapes(
    pgflow._normalize_flow_shape(shape), pgflow._get_flow_shape(flow_slug)
  );
  select f.queue_mode into v_mode from pgflow.flows as f where f.flow_slug = _flow_differences.flow_slug;
  if v_mode <> queue_mode then
    v_routing := v_routing || format('Queue mode of flow "%s" differs: expected "%s", persisted "%s"',
      flow_slug, queue_mode, v_mode);
  end if;
  -- With a different shape the steps do not line up, and the shape differences say enough.
  v_persisted := pgflow._get_queue_routes(flow_slug);
  if cardinality(differences) = 0 and v_persisted <> derived then
    v_routing := v_routing || array(
      select format('Route of step "%s" of flow "%s" differs: expected queue "%s", persisted "%s"',
        e.value ->> 'stepSlug', flow_slug, e.value ->> 'queueName', v_persisted -> (e.ordinality - 1)::int ->> 'queueName')
      from jsonb_array_elements(derived) with ordinality as e
      where e.value <> v_persisted -> (e.ordinality - 1)::int
      order by e.ordinality
    );
  end if;
  kind := case when cardinality(differences) > 0 then 'shape' when cardinality(v_routing) > 0 then 'routing' end;
  differences := differences || v_routing;
end;
$$;

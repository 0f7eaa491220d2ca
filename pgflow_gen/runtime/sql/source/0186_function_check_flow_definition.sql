-- Checks a flow definition before it is compiled or verified: the shape is valid, every step has a
-- route in the queue mode (pgflow.derive_queue_routes), and a supplied route_map ([{stepSlug,
-- queueName}] in step order) is exactly the derived one (required in step mode). Returns the
-- queues in step order and the derived route map. Raises; no writes, no locks. Called by
-- ensure_flow_compiled and verify_flow_compiled.
create function pgflow._check_flow_definition(
  flow_slug text,
  shape jsonb,
  queue_mode text,
  route_map jsonb,
  out queues text[],
  out derived jsonb
)
language plpgsql
stable
set search_path = ''
as $$
declare
  v_step_slugs text[];
begin
  perform pgflow._validate_flow_shape(shape);
  v_step_slugs := array(select s.value ->> 'slug' from jsonb_array_elements(shape -> 'steps') as s);
  select coalesce(array_agg(r.queue_name order by r.step_index), '{}'),
    coalesce(jsonb_agg(jsonb_build_object('stepSlug', r.step_slug, 'queueName', r.queue_name) order by r.step_index), '[]')
  into queues, derived
  from pgflow.derive_queue_routes(flow_slug, v_step_slugs, queue_mode) as r;
  perform pgflow._check_route_map(flow_slug, queue_mode, derived, route_map);
end;
$$;

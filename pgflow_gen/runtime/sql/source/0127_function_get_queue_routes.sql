-- The persisted route map of a flow, [{stepSlug, queueName}] in step order: the format workers
-- send to ensure_flow_compiled, so the two compare directly.
create function pgflow._get_queue_routes(flow_slug text)
returns jsonb
language sql
stable
set search_path = ''
as $$
  select coalesce(jsonb_agg(
    jsonb_build_object('stepSlug', s.step_slug, 'queueName', s.queue_name) order by s.step_index
  ), '[]'::jsonb)
  from pgflow.steps as s
  where s.flow_slug = _get_queue_routes.flow_slug
$$;

-- Keeps a flow's stored input schema in step with the shape a worker or a migration compiled it
-- with: the shape's "inputSchema" replaces the stored one. A shape without it (a worker older
-- than engine 0006) leaves the stored schema as it is. The schema is not part of the compared
-- shape: a new schema for the same steps is a newer description of the same flow.
-- Called by _adopt_flow_description under the flow's definition lock.
create function pgflow._store_input_schema(flow_slug text, shape jsonb)
returns void
language sql
volatile
set search_path = ''
as $$
  update pgflow.flows as f
  set input_schema = _store_input_schema.shape -> 'inputSchema'
  where f.flow_slug = _store_input_schema.flow_slug
    and _store_input_schema.shape ? 'inputSchema'
    and f.input_schema is distinct from _store_input_schema.shape -> 'inputSchema';
$$;

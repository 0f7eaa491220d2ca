-- Keeps the payload schemas of a flow's signal steps in step with the shape a worker or a
-- migration compiled it with: a step's "payloadSchema" replaces the stored one, and a signal step
-- the shape gives none (a hand-written shape) keeps its own. Not part of the compared shape.
-- Called by _adopt_flow_description under the flow's definition lock.
create function pgflow._store_payload_schemas(flow_slug text, shape jsonb)
returns void
language sql
volatile
set search_path = ''
as $$
  update pgflow.steps as s
  set payload_schema = e.step -> 'payloadSchema'
  from jsonb_array_elements(_store_payload_schemas.shape -> 'steps') as e (step)
  where s.flow_slug = _store_payload_schemas.flow_slug and s.step_slug = e.step ->> 'slug'
    and s.step_type = 'signal' and e.step ? 'payloadSchema'
    and s.payload_schema is distinct from e.step -> 'payloadSchema';
$$;

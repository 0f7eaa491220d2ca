-- Appends a step to a flow-mode flow (its step_index is the next one, its route the flow's
-- default queue) with its dependency edges. Idempotent: re-adding an identical step returns it;
-- any difference is an error. Step-queued flows are refused: they are defined only as a whole, by
-- ensure_flow_compiled. Takes the flow's definition lock. A subflow step (engine 0028) is
-- step_type 'subflow' (or 'map', one child run per element) with the child's flow in subflow_slug.
create function pgflow.add_step(
  flow_slug text,
  step_slug text,
  deps_slugs text[] default '{}',
  max_attempts int default null,
  base_delay int default null,
  timeout int default null,
  start_delay int default null,
  step_type text default 'single',
  required_input_pattern jsonb default null,
  forbidden_input_pattern jsonb default null,
  when_unmet text default 'skip',
  when_exhausted text default 'fail',
  subflow_slug text default null
)
returns pgflow.steps
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_mode text;
begin
  perform pgflow._lock_flow_definition(flow_slug);

  select f.queue_mode into v_mode from pgflow.flows as f where f.flow_slug = add_step.flow_slug;
  if not found then
    raise exception 'Flow "%" does not exist.', flow_slug
      using errcode = 'P0002', hint = 'Create it first with pgflow.create_flow().';
  end if;
  if v_mode = 'step' then
    raise exception 'Flow "%" uses per-step queues, so add_step cannot extend it.', flow_slug
      using errcode = '55000',
        detail = 'A step-queued flow is defined as a whole, with its complete routes, by pgflow.ensure_flow_compiled().',
        hint = 'Compile the complete flow (its generated migration or a worker does this), or use a new flow slug.';
  end if;

  return pgflow._insert_step(
    flow_slug, step_slug, deps_slugs, max_attempts, base_delay, timeout, start_delay, step_type,
    required_input_pattern, forbidden_input_pattern, when_unmet, when_exhausted,
    pgflow.default_queue_name(flow_slug), subflow_slug
  );
end;
$$;

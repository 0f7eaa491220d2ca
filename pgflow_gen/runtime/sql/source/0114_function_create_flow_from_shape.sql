-- Writes a complete flow definition from a shape in the given queue mode: the flow with
-- shape.options, every step in array order with its options and its route from queue_names (in
-- step order), then the queues (none for a signal or subflow step). Every queue name is checked before
-- anything is written (in flow mode by create_flow). Called by ensure_flow_compiled under the
-- definition lock, for a flow that does not exist.
create function pgflow._create_flow_from_shape(flow_slug text, shape jsonb, queue_mode text, queue_names text[])
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_options jsonb := coalesce(shape -> 'options', '{}');
  v_step jsonb;
  v_index bigint;
  v_step_options jsonb;
  v_queue text;
begin
  if queue_mode = 'flow' then
    perform pgflow.create_flow(
      flow_slug, (v_options ->> 'maxAttempts')::int, (v_options ->> 'baseDelay')::int,
      (v_options ->> 'timeout')::int
    );
  else
    perform pgflow._preflight_queue_names(flow_slug, queue_names);
    perform pgflow._insert_flow(
      flow_slug, 'step', (v_options ->> 'maxAttempts')::int, (v_options ->> 'baseDelay')::int,
      (v_options ->> 'timeout')::int
    );
  end if;

  for v_step, v_index in select s.value, s.ordinality from jsonb_array_elements(shape -> 'steps') with ordinality as s loop
    v_step_options := coalesce(v_step -> 'options', '{}');
    perform pgflow._insert_step(
      flow_slug,
      v_step ->> 'slug',
      array(select jsonb_array_elements_text(coalesce(v_step -> 'dependencies', '[]'))),
      (v_step_options ->> 'maxAttempts')::int,
      (v_step_options ->> 'baseDelay')::int,
      (v_step_options ->> 'timeout')::int,
      (v_step_options ->> 'startDelay')::int,
      coalesce(v_step ->> 'stepType', 'single'),
      case when (v_step #>> '{requiredInputPattern,defined}')::boolean
        then v_step #> '{requiredInputPattern,value}' end,
      case when (v_step #>> '{forbiddenInputPattern,defined}')::boolean
        then v_step #> '{forbiddenInputPattern,value}' end,
      coalesce(v_step ->> 'whenUnmet', 'skip'),
      coalesce(v_step ->> 'whenExhausted', 'fail'),
      queue_names[v_index],
      v_step ->> 'subflowSlug'
    );
  end loop;

  if queue_mode = 'step' then
    -- A signal or subflow step runs no task in a worker: its route is reserved, but it has no queue.
    for v_queue in
      select s.queue_name from pgflow.steps as s
      where s.flow_slug = _create_flow_from_shape.flow_slug and s.step_type <> 'signal'
        and s.subflow_slug is null
      order by s.step_index
    loop
      perform pgmq.create(v_queue);
      perform pgflow._create_priority_index(v_queue);
    end loop;
  end if;
end;
$$;

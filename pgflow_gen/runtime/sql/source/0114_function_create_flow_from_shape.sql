-- Writes a complete flow definition from a shape: the flow with shape.options, then every step
-- in array order with its options. Called by ensure_flow_compiled under the definition lock.
create function pgflow._create_flow_from_shape(flow_slug text, shape jsonb)
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_options jsonb := coalesce(shape -> 'options', '{}');
  v_step jsonb;
  v_step_options jsonb;
begin
  perform pgflow.create_flow(
    flow_slug,
    (v_options ->> 'maxAttempts')::int,
    (v_options ->> 'baseDelay')::int,
    (v_options ->> 'timeout')::int
  );
  for v_step in select value from jsonb_array_elements(shape -> 'steps') loop
    v_step_options := coalesce(v_step -> 'options', '{}');
    perform pgflow.add_step(
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
      coalesce(v_step ->> 'whenExhausted', 'fail')
    );
  end loop;
end;
$$;

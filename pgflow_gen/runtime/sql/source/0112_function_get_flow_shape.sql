-- The structural shape of a persisted flow, in the format workers send to ensure_flow_compiled:
-- {"steps": [{slug, stepType, dependencies (sorted), whenUnmet, whenExhausted,
-- requiredInputPattern, forbiddenInputPattern, and subflowSlug on a subflow step}]}; options are
-- not part of the shape.
create function pgflow._get_flow_shape(flow_slug text)
returns jsonb
language sql
stable
set search_path = ''
as $$
  select jsonb_build_object('steps', coalesce(jsonb_agg(
    jsonb_build_object(
      'slug', s.step_slug,
      'stepType', s.step_type,
      'dependencies', coalesce((
        select jsonb_agg(d.dep_slug order by d.dep_slug)
        from pgflow.deps as d
        where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug
      ), '[]'::jsonb),
      'whenUnmet', s.when_unmet,
      'whenExhausted', s.when_exhausted,
      'requiredInputPattern', case when s.required_input_pattern is null
        then '{"defined": false}'::jsonb
        else jsonb_build_object('defined', true, 'value', s.required_input_pattern) end,
      'forbiddenInputPattern', case when s.forbidden_input_pattern is null
        then '{"defined": false}'::jsonb
        else jsonb_build_object('defined', true, 'value', s.forbidden_input_pattern) end
    ) || case when s.subflow_slug is not null then jsonb_build_object('subflowSlug', s.subflow_slug)
      else '{}'::jsonb end
    order by s.step_index
  ), '[]'::jsonb))
  from pgflow.steps as s
  where s.flow_slug = _get_flow_shape.flow_slug
$$;

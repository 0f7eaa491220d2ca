-- The structural part of a shape with defaults filled in and dependencies sorted, so that it
-- compares equal to _get_flow_shape of the same definition (a subflow step keeps its subflowSlug).
-- Called by ensure_flow_compiled.
create function pgflow._normalize_flow_shape(shape jsonb)
returns jsonb
language sql
immutable
set search_path = ''
as $$
  select jsonb_build_object('steps', coalesce(jsonb_agg(
    jsonb_build_object(
      'slug', s.value -> 'slug',
      'stepType', coalesce(s.value -> 'stepType', '"single"'),
      'dependencies', coalesce((
        select jsonb_agg(d.value order by d.value)
        from jsonb_array_elements_text(coalesce(s.value -> 'dependencies', '[]')) as d
      ), '[]'::jsonb),
      'whenUnmet', coalesce(s.value -> 'whenUnmet', '"skip"'),
      'whenExhausted', coalesce(s.value -> 'whenExhausted', '"fail"'),
      'requiredInputPattern', case when (s.value #>> '{requiredInputPattern,defined}')::boolean
        then jsonb_build_object('defined', true, 'value', s.value #> '{requiredInputPattern,value}')
        else '{"defined": false}'::jsonb end,
      'forbiddenInputPattern', case when (s.value #>> '{forbiddenInputPattern,defined}')::boolean
        then jsonb_build_object('defined', true, 'value', s.value #> '{forbiddenInputPattern,value}')
        else '{"defined": false}'::jsonb end
    ) || case when s.value ? 'subflowSlug' then jsonb_build_object('subflowSlug', s.value -> 'subflowSlug')
      else '{}'::jsonb end
    order by s.ordinality
  ), '[]'::jsonb))
  from jsonb_array_elements(shape -> 'steps') with ordinality as s
$$;

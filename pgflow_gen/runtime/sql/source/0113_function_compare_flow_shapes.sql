-- Human-readable differences between two flow shapes, compared step by step in order
-- (empty when structurally equal). Options are ignored: they are tunable in place.
create function pgflow._compare_flow_shapes(expected jsonb, actual jsonb)
returns text[]
language plpgsql
immutable
set search_path = ''
as $$
declare
  v_expected jsonb := coalesce(expected -> 'steps', '[]'::jsonb);
  v_actual jsonb := coalesce(actual -> 'steps', '[]'::jsonb);
  v_count int := greatest(jsonb_array_length(v_expected), jsonb_array_length(v_actual));
  v_differences text[] := '{}';
  v_e jsonb;
  v_a jsonb;
  v_key text;
begin
  if jsonb_array_length(v_expected) <> jsonb_array_length(v_actual) then
    v_differences := v_differences || format('Step count differs: %s vs %s',
      jsonb_array_length(v_expected), jsonb_array_length(v_actual));
  end if;
  for i in 0 .. v_count - 1 loop
    v_e := v_expected -> i;
    v_a := v_actual -> i;
    if v_e is null then
      v_differences := v_differences || format('Step at index %s: missing in first shape (second has "%s")', i, v_a ->> 'slug');
      continue;
    elsif v_a is null then
      v_differences := v_differences || format('Step at index %s: missing in second shape (first has "%s")', i, v_e ->> 'slug');
      continue;
    end if;
    if v_e -> 'slug' is distinct from v_a -> 'slug' then
      v_differences := v_differences || format('Step at index %s: slug differs "%s" vs "%s"', i, v_e ->> 'slug', v_a ->> 'slug');
    end if;
    if v_e -> 'stepType' is distinct from v_a -> 'stepType' then
      v_differences := v_differences || format('Step at index %s: type differs "%s" vs "%s"', i, v_e ->> 'stepType', v_a ->> 'stepType');
    end if;
    if coalesce(v_e -> 'dependencies', '[]') is distinct from coalesce(v_a -> 'dependencies', '[]') then
      v_differences := v_differences || format('Step at index %s: dependencies differ %s vs %s', i,
        coalesce(v_e -> 'dependencies', '[]'), coalesce(v_a -> 'dependencies', '[]'));
    end if;
    foreach v_key in array array['whenUnmet', 'whenExhausted', 'requiredInputPattern', 'forbiddenInputPattern',
      'subflowSlug'] loop
      if v_e -> v_key is distinct from v_a -> v_key then
        v_differences := v_differences || format('Step at index %s: %s differs %s vs %s', i, v_key, v_e -> v_key, v_a -> v_key);
      end if;
    end loop;
  end loop;
  return v_differences;
end;
$$;

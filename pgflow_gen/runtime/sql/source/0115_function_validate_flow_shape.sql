-- Rejects a malformed shape document with a clear error before anything is compared or written.
-- Called by ensure_flow_compiled.
create function pgflow._validate_flow_shape(shape jsonb)
returns void
language plpgsql
immutable
set search_path = ''
as $$
declare
  v_step jsonb;
  v_index int := 0;
begin
  if jsonb_typeof(shape) is distinct from 'object' or jsonb_typeof(shape -> 'steps') is distinct from 'array' then
    raise exception 'Invalid flow shape: expected an object with a "steps" array.'
      using errcode = '22023', detail = left(coalesce(shape::text, 'NULL'), 200);
  end if;
  for v_step in select value from jsonb_array_elements(shape -> 'steps') loop
    if jsonb_typeof(v_step) is distinct from 'object' or jsonb_typeof(v_step -> 'slug') is distinct from 'string' then
      raise exception 'Invalid flow shape: step at index % has no string "slug".', v_index
        using errcode = '22023', detail = left(v_step::text, 200);
    end if;
    if v_step ? 'dependencies' and jsonb_typeof(v_step -> 'dependencies') <> 'array' then
      raise exception 'Invalid flow shape: "dependencies" of step "%" is not an array.', v_step ->> 'slug'
        using errcode = '22023';
    end if;
    v_index := v_index + 1;
  end loop;
end;
$$;

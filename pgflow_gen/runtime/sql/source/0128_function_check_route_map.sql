-- Rejects a caller's route map that is not exactly the routes the engine derived (complete, in
-- step order, no extra or duplicate entries, nothing else in an entry), listing the differences.
-- A step-queued flow must send its map; a flow-mode caller may omit it.
create function pgflow._check_route_map(flow_slug text, queue_mode text, derived jsonb, route_map jsonb)
returns void
language plpgsql
immutable
set search_path = ''
as $$
declare
  v_differences text[] := '{}';
  v_expected jsonb;
  v_actual jsonb;
begin
  if route_map is null then
    if queue_mode = 'step' then
      raise exception 'The route map of step-queued flow "%" is missing.', flow_slug
        using errcode = '22023',
          detail = 'A step-queued flow is compiled with its complete route map.',
          hint = format('Send the routes the engine derives: %s', derived);
    end if;
    return;
  end if;
  if jsonb_typeof(route_map) <> 'array' then
    raise exception 'The route map of flow "%" must be a JSON array.', flow_slug
      using errcode = '22023', detail = left(route_map::text, 200),
        hint = format('Send the routes the engine derives: %s', derived);
  end if;
  if route_map = derived then
    return;
  end if;
  for i in 0 .. greatest(jsonb_array_length(derived), jsonb_array_length(route_map)) - 1 loop
    v_expected := derived -> i;
    v_actual := route_map -> i;
    if v_actual is null then
      v_differences := v_differences || format('entry %s is missing: expected %s', i, v_expected);
    elsif v_expected is null then
      v_differences := v_differences || format('entry %s is extra: %s', i, v_actual);
    elsif v_actual <> v_expected then
      v_differences := v_differences || format('entry %s: expected %s, got %s', i, v_expected, v_actual);
    end if;
  end loop;
  raise exception 'The route map of flow "%" does not match the routes the engine derives.', flow_slug
    using errcode = '22023', detail = array_to_string(v_differences, E'\n'),
      hint = 'Regenerate the flow with the pgflow-gen version that matches the engine.';
end;
$$;

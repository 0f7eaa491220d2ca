-- The values one field of a cron expression names, read as the scheduler's croniter reads the
-- standard syntax (engine 0021): a comma list of `*`, `n`, `a-b` (a < b) and `*/s`, `n/s`
-- (n to the field's end), `a-b/s`, with month names (jan-dec, field 3) and day names (sun-sat,
-- field 4; 7 is Sunday as well). Fields: 0 second, 1 minute, 2 hour, 3 day of month, 4 month,
-- 5 day of week. Null when the field uses what the engine does not read (L, W, #, H, ?, equal or
-- wrapping ranges, `*` in a list): its caller then falls back to a coarser rule. No writes.
create function pgflow._cron_values(field text, field_index int)
returns int[]
language plpgsql
immutable
set search_path = ''
as $$
declare
  v_low int := (array[0, 0, 0, 1, 1, 0])[field_index + 1];
  v_high int := (array[59, 59, 23, 31, 12, 6])[field_index + 1];
  v_names text[] := case field_index
    when 4 then array['jan', 'feb', 'mar', 'apr', 'may', 'jun', 'jul', 'aug', 'sep', 'oct', 'nov', 'dec']
    when 5 then array['sun', 'mon', 'tue', 'wed', 'thu', 'fri', 'sat']
  end;
  v_item text;
  v_parts text[];
  v_from int;
  v_to int;
  v_step int;
  v_values int[] := '{}';
begin
  if field = '*' or field = '?' and field_index in (3, 5) then
    return array(select generate_series(v_low, v_high));
  end if;
  foreach v_item in array string_to_array(field, ',') loop
    v_parts := regexp_match(v_item, '^(\*|[a-z]{3}|[0-9]{1,2})(?:-([a-z]{3}|[0-9]{1,2}))?(?:/([0-9]{1,2}))?$');
    if v_parts is null or v_parts[1] = '*' and (v_parts[2] is not null or v_parts[3] is null) then
      return null;
    end if;
    v_step := coalesce(v_parts[3]::int, 1);
    if v_parts[1] = '*' then
      v_from := v_low;
      v_to := v_high;
    else
      v_from := case when v_parts[1] ~ '^[0-9]' then v_parts[1]::int
        else array_position(v_names, v_parts[1]) - 1 + v_low end;
      v_to := case
        when v_parts[2] ~ '^[0-9]' then v_parts[2]::int
        when v_parts[2] is not null then array_position(v_names, v_parts[2]) - 1 + v_low
        when v_parts[3] is not null then v_high
        else v_from
      end;
      if v_from is null or v_to is null then
        return null;  -- a name the field does not have
      end if;
      if field_index = 5 and v_from = 7 and v_parts[2] is null and v_parts[3] is null then
        v_from := 0;
        v_to := 0;
      end if;
      if v_from < v_low or v_to > v_high or (v_parts[2] is not null or v_parts[3] is not null) and v_from >= v_to then
        return null;
      end if;
    end if;
    if v_step < 1 then
      return null;
    end if;
    v_values := v_values || array(select generate_series(v_from, v_to, v_step));
  end loop;
  return v_values;
end;
$$;

-- Whether a schedule's cron expression (5 fields, or 6 with the seconds last) names a slot in
-- its time zone, as the scheduler's croniter reads it (engine 0021): the slot's local second,
-- minute, hour, month and day match their fields, the day by the day of month or the day of week
-- when both are restricted (by both otherwise; a field is unrestricted when it is `*` or names
-- every day while the other field holds a `*`). Within the hour after the clock skipped some
-- local time (a change to daylight saving time) a slot is also named when a skipped time up to
-- that far before it is, as croniter moves those forwards (to the gap's end, or by the gap).
-- Null when the expression uses what pgflow._cron_values does not read. Called by
-- pgflow.start_scheduled_runs. No writes.
create function pgflow._cron_names(cron text, timezone text, slot timestamptz)
returns boolean
language plpgsql
stable
set search_path = ''
as $$
declare
  v_fields text[] := regexp_split_to_array(lower(btrim(cron)), '\s+');
  v_seconds int[];
  v_minutes int[];
  v_hours int[];
  v_days int[];
  v_months int[];
  v_weekdays int[];
  v_any_day boolean;
  v_any_weekday boolean;
  v_day boolean;
  v_weekday boolean;
  v_local timestamp := slot at time zone timezone;
  -- How much further than an hour the local clock went in the hour before the slot.
  v_skipped interval := v_local - ((slot - interval '1 hour') at time zone timezone) - interval '1 hour';
  v_at timestamp;
begin
  if cardinality(v_fields) = 5 then
    v_fields := array['0'] || v_fields;
  elsif cardinality(v_fields) = 6 then
    v_fields := array[v_fields[6]] || v_fields[1:5];
  else
    return null;
  end if;
  v_seconds := pgflow._cron_values(v_fields[1], 0);
  v_minutes := pgflow._cron_values(v_fields[2], 1);
  v_hours := pgflow._cron_values(v_fields[3], 2);
  v_days := pgflow._cron_values(v_fields[4], 3);
  v_months := pgflow._cron_values(v_fields[5], 4);
  v_weekdays := pgflow._cron_values(v_fields[6], 5);
  if v_seconds is null or v_minutes is null or v_hours is null or v_days is null
      or v_months is null or v_weekdays is null then
    return null;
  end if;
  v_any_day := v_fields[4] in ('*', '?')
    or strpos(v_fields[6], '*') > 0 and v_days @> array(select generate_series(1, 31));
  v_any_weekday := v_fields[6] in ('*', '?')
    or strpos(v_fields[4], '*') > 0 and v_weekdays @> array(select generate_series(0, 6));
  -- The slot itself, then each whole second the clock skipped up to v_skipped before it.
  v_at := v_local;
  loop
    v_day := extract(day from v_at)::int = any (v_days);
    v_weekday := extract(dow from v_at)::int = any (v_weekdays);
    if date_trunc('second', v_at) = v_at
        and (v_at = v_local or (v_at at time zone timezone) at time zone timezone <> v_at)
        and extract(second from v_at)::int = any (v_seconds)
        and extract(minute from v_at)::int = any (v_minutes)
        and extract(hour from v_at)::int = any (v_hours)
        and extract(month from v_at)::int = any (v_months)
        and ((v_any_day or v_any_weekday) and (v_any_day or v_day) and (v_any_weekday or v_weekday)
          or not (v_any_day or v_any_weekday) and (v_day or v_weekday)) then
      return true;
    end if;
    if v_at = v_local then
      if v_skipped <= interval '0' then
        return false;
      end if;
      v_at := date_trunc('second', v_local - v_skipped);
    else
      v_at := v_at + interval '1 second';
    end if;
    if v_at >= v_local then
      return false;
    end if;
  end loop;
end;
$$;

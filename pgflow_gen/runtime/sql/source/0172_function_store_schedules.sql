-- Keeps a flow's schedules in step with its shape's "schedules" ([{name, cron, timezone, input,
-- catchUp, priority}], engine 0017; priority since 0031, 0 when absent): new ones are added
-- (their slots count from now), changed ones take the new cron, time zone, input, catch-up and
-- priority and keep their last slot and pause, and the ones the shape no longer has are
-- deleted. A shape without "options" (a hand-written one) changes nothing. Checks each entry (a
-- name, a cron, a known time zone, a catch-up policy, a priority from 0 to 1000). Returns the
-- changes, [{"schedule", "change": "added" | "changed" | "removed"}]. Called by
-- _adopt_flow_description under the flow's definition lock.
create function pgflow._store_schedules(flow_slug text, shape jsonb)
returns jsonb
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_wanted jsonb := coalesce(shape -> 'schedules', '[]');
  v_entry jsonb;
  v_changes jsonb := '[]';
  v_row record;
begin
  if shape -> 'options' is null then
    return v_changes;
  end if;
  if jsonb_typeof(v_wanted) <> 'array' then
    raise exception 'Invalid flow shape: "schedules" must be an array, got %.', jsonb_typeof(v_wanted)
      using errcode = '22023';
  end if;
  for v_entry in select e.value from jsonb_array_elements(v_wanted) as e loop
    if jsonb_typeof(v_entry -> 'name') is distinct from 'string' or jsonb_typeof(v_entry -> 'cron') is distinct from 'string' then
      raise exception 'Invalid flow shape: a schedule needs a "name" and a "cron" string, got %.', v_entry
        using errcode = '22023';
    end if;
    if not exists (select 1 from pg_catalog.pg_timezone_names as z where z.name = coalesce(v_entry ->> 'timezone', 'UTC')) then
      raise exception 'Invalid flow shape: schedule "%" has an unknown time zone "%".', v_entry ->> 'name', v_entry ->> 'timezone'
        using errcode = '22023', hint = 'Use an IANA name such as UTC or Europe/Paris.';
    end if;
    if coalesce(v_entry ->> 'catchUp', 'none') not in ('none', 'latest', 'all') then
      raise exception 'Invalid flow shape: schedule "%" has catchUp "%"; it takes none, latest or all.',
        v_entry ->> 'name', v_entry ->> 'catchUp'
        using errcode = '22023';
    end if;
    if v_entry ? 'priority' and not (jsonb_typeof(v_entry -> 'priority') = 'number'
        and (v_entry ->> 'priority') ~ '^(1000|[0-9]{1,3})$') then
      raise exception 'Invalid flow shape: schedule "%" has priority %; it takes a whole number from 0 to 1000.',
        v_entry ->> 'name', v_entry -> 'priority'
        using errcode = '22023';
    end if;
  end loop;
  if (select count(distinct e.value ->> 'name') <> count(*) from jsonb_array_elements(v_wanted) as e) then
    raise exception 'Invalid flow shape: two schedules have the same name.' using errcode = '22023';
  end if;

  for v_row in
    select e.value as entry, s.schedule_name is null as is_new,
      s.cron is distinct from e.value ->> 'cron'
        or s.timezone is distinct from coalesce(e.value ->> 'timezone', 'UTC')
        or s.input is distinct from coalesce(e.value -> 'input', '{}')
        or s.catch_up is distinct from coalesce(e.value ->> 'catchUp', 'none')
        or s.priority is distinct from coalesce((e.value ->> 'priority')::int, 0) as is_changed
    from jsonb_array_elements(v_wanted) with ordinality as e (value, ord)
    left join pgflow.schedules as s
      on s.flow_slug = _store_schedules.flow_slug and s.schedule_name = e.value ->> 'name'
    order by e.ord
  loop
    continue when not (v_row.is_new or v_row.is_changed);
    insert into pgflow.schedules as s (flow_slug, schedule_name, cron, timezone, input, catch_up, priority)
    values (_store_schedules.flow_slug, v_row.entry ->> 'name', v_row.entry ->> 'cron',
      coalesce(v_row.entry ->> 'timezone', 'UTC'), coalesce(v_row.entry -> 'input', '{}'),
      coalesce(v_row.entry ->> 'catchUp', 'none'), coalesce((v_row.entry ->> 'priority')::int, 0))
    on conflict on constraint schedules_pkey do update
    set cron = excluded.cron, timezone = excluded.timezone, input = excluded.input,
      catch_up = excluded.catch_up, priority = excluded.priority, updated_at = now();
    v_changes := v_changes || jsonb_build_object('schedule', v_row.entry ->> 'name',
      'change', case when v_row.is_new then 'added' else 'changed' end);
  end loop;

  with gone as (
    delete from pgflow.schedules as s
    where s.flow_slug = _store_schedules.flow_slug
      and not exists (select 1 from jsonb_array_elements(v_wanted) as e where e.value ->> 'name' = s.schedule_name)
    returning s.schedule_name
  )
  select v_changes || coalesce(jsonb_agg(jsonb_build_object('schedule', g.schedule_name, 'change', 'removed')
      order by g.schedule_name), '[]')
  into v_changes from gone as g;
  return v_changes;
end;
$$;

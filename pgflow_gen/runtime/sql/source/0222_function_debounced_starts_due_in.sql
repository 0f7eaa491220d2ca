-- Seconds until the earliest pending debounced start is due (engine 0030): 0 when one is due
-- now, null when none is pending. The workers' scheduler asks it on every tick to know when to
-- wake (workers read no table). Reads one index entry.
create function pgflow.debounced_starts_due_in()
returns float8
language sql
stable
security definer
set search_path = ''
as $$
  select greatest(0, extract(epoch from m.start_at - clock_timestamp()))::float8
  from (select min(d.start_at) as start_at from pgflow.debounced_starts as d) as m
  where m.start_at is not null;
$$;

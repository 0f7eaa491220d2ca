-- Engine migration 0030: debounce.
--
-- pgflow.debounce_start(flow_slug, input, debounce_key, period_s, max_wait_s) collapses a burst
-- of starts with one key into one run, started period_s after the last start with its input (or
-- max_wait_s after the first); pending bursts live in the new table pgflow.debounced_starts, and
-- the workers' elected scheduler starts the due ones with pgflow.start_debounced_runs() (issue
-- 38: starting flows where the application lives). Clients may debounce; workers start them.

-- BEGIN HAND-WRITTEN: tables and data, applied before the functions below.
create table pgflow.debounced_starts (
  flow_slug text not null references pgflow.flows (flow_slug) on delete cascade,
  debounce_key text not null,
  input jsonb not null,
  -- How many starts the burst has collapsed so far, the first's and the last's time.
  starts int not null default 1,
  first_at timestamptz not null,
  last_at timestamptz not null,
  -- When the run starts; deadline_at (null: none) is the latest start_at may move to.
  start_at timestamptz not null,
  deadline_at timestamptz,
  primary key (flow_slug, debounce_key)
);
create index debounced_starts_start_at on pgflow.debounced_starts (start_at);
-- END HAND-WRITTEN

-- Written by `make migration` from pgflow_gen/runtime/sql/source/: edit the source, then
-- write the migration again; only the header and the hand-written section above are kept.

-- pgflow._debounce_start: source/0217_function_debounce_start_internal.sql
create function pgflow._debounce_start(
  flow_slug text, input jsonb, debounce_key text, period_s numeric, max_wait_s numeric, now timestamptz
)
returns pgflow.debounced_starts
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_due pgflow.debounced_starts;
  v_pending pgflow.debounced_starts;
begin
  if not exists (select 1 from pgflow.flows as f where f.flow_slug = _debounce_start.flow_slug) then
    raise exception 'Flow "%" does not exist.', flow_slug
      using errcode = 'P0002', hint = 'Check the slug (it is case-sensitive) or compile the flow first.';
  end if;
  if input is null then
    raise exception 'A debounced start needs an input (JSON; {} for none).' using errcode = '22023';
  end if;
  if debounce_key is null or debounce_key = '' or length(debounce_key) > 200 then
    raise exception 'A debounce key is text of 1 to 200 characters.' using errcode = '22023';
  end if;
  if period_s is null or period_s <= 0 or period_s > 2592000 then
    raise exception 'period_s must be more than 0 and at most 2592000 (30 days), not %.', period_s
      using errcode = '22023';
  end if;
  if max_wait_s is not null and (max_wait_s <= 0 or max_wait_s > 2592000) then
    raise exception 'max_wait_s must be null or more than 0 and at most 2592000 (30 days), not %.',
      max_wait_s using errcode = '22023';
  end if;
  perform pgflow._require_flow_route(flow_slug);
  -- A burst whose run is due but not started yet (the scheduler has not come by) ended before
  -- this start: its run starts now, and this start opens a new burst.
  delete from pgflow.debounced_starts as d
  where d.flow_slug = _debounce_start.flow_slug and d.debounce_key = _debounce_start.debounce_key
    and d.start_at <= now
  returning * into v_due;
  if found then
    perform pgflow._start_debounced(v_due);
  end if;
  insert into pgflow.debounced_starts as d
    (flow_slug, debounce_key, input, first_at, last_at, start_at, deadline_at)
  values (
    flow_slug, debounce_key, input, now, now,
    least(now + make_interval(secs => period_s), now + make_interval(secs => max_wait_s)),
    now + make_interval(secs => max_wait_s)
  )
  on conflict on constraint debounced_starts_pkey do update
    set input = excluded.input, starts = d.starts + 1, last_at = excluded.last_at,
      start_at = least(excluded.last_at + make_interval(secs => period_s), d.deadline_at)
  returning * into v_pending;
  if v_pending.starts = 1 then
    -- A new burst: wake the workers' schedulers (their listeners hear it), idle ones too.
    perform pg_notify('pgflow_debounced', '{"event": "debounce:pending"}');
  end if;
  return v_pending;
end;
$$;

-- pgflow._start_debounced: source/0218_function_start_debounced.sql
create function pgflow._start_debounced(burst pgflow.debounced_starts)
returns pgflow.runs
language sql
volatile
set search_path = ''
as $$
  select r.* from pgflow._start_runs(
    burst.flow_slug, array[burst.input],
    array['debounce:' || burst.debounce_key || ':'
      || to_char(burst.first_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')]
  ) as r;
$$;

-- pgflow.debounce_start: source/0219_function_debounce_start.sql
create function pgflow.debounce_start(
  flow_slug text, input jsonb, debounce_key text, period_s numeric, max_wait_s numeric default null
)
returns pgflow.debounced_starts
language sql
volatile
security definer
set search_path = ''
as $$
  select * from pgflow._debounce_start(
    flow_slug, input, debounce_key, period_s, max_wait_s, clock_timestamp()
  );
$$;

-- pgflow._start_debounced_runs: source/0220_function_start_debounced_runs_internal.sql
create function pgflow._start_debounced_runs(now timestamptz)
returns table (flow_slug text, debounce_key text, starts int, run_id uuid)
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_burst pgflow.debounced_starts;
  v_run pgflow.runs;
begin
  for v_burst in
    delete from pgflow.debounced_starts as d
    where (d.flow_slug, d.debounce_key) in (
      select p.flow_slug, p.debounce_key from pgflow.debounced_starts as p
      where p.start_at <= now order by p.start_at limit 100
      for update skip locked
    )
    returning *
  loop
    v_run := pgflow._start_debounced(v_burst);
    flow_slug := v_burst.flow_slug;
    debounce_key := v_burst.debounce_key;
    starts := v_burst.starts;
    run_id := v_run.run_id;
    return next;
  end loop;
end;
$$;

-- pgflow.start_debounced_runs: source/0221_function_start_debounced_runs.sql
create function pgflow.start_debounced_runs()
returns table (flow_slug text, debounce_key text, starts int, run_id uuid)
language plpgsql
volatile
security definer
set search_path = ''
as $$
begin
  perform pgflow._require_flow_route(null);
  return query select * from pgflow._start_debounced_runs(clock_timestamp());
end;
$$;

-- pgflow.debounced_starts_due_in: source/0222_function_debounced_starts_due_in.sql
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
-- No engine function runs for PUBLIC (engine 0019), those above included.
revoke execute on all functions in schema pgflow from public;

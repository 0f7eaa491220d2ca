-- Engine migration 0018: fair concurrency per key.
--
-- A step may name a concurrency key: a JSON path into the run's input (step option
-- concurrencyKey) and how many tasks of one key value may hold a queue message at once, queued
-- or started (concurrencyLimit). Its tasks take the key's value (step_tasks.concurrency_key) and
-- are created parked, without a message (pgflow.parked_tasks, pgflow._park_keyed_tasks). When a
-- keyed task finishes, its place passes at once to its key's oldest parked task
-- (pgflow._pass_concurrency_places, at the end of complete_task and complete_tasks); what is
-- left is settled when the transaction commits (pgflow._balance_concurrency_keys, a deferred
-- trigger that locks the keys it touched in key order and counts in pgflow.concurrency_keys).
-- So a key's backlog never fills the queue, and another key's task waits behind at most a
-- limit's worth of it. Steps without a key are untouched: their task trigger never fires (a
-- WHEN clause), a completion reads one setting, and only the batched completion path leaves a
-- keyed child step to the general one. pgflow.concurrency_usage reports each keyed step's keys.

alter table pgflow.steps
  add column opt_concurrency_key text,
  add column opt_concurrency_limit int,
  add constraint opt_concurrency_is_whole check (
    (opt_concurrency_key is null) = (opt_concurrency_limit is null) and coalesce(opt_concurrency_limit, 1) >= 1
  );

alter table pgflow.step_tasks add column concurrency_key text;

-- Fair concurrency per key (engine 0018). A step with a concurrency key (steps.opt_concurrency_key,
-- a JSON path into the run's input, and opt_concurrency_limit) gives each of its tasks the key's
-- value (step_tasks.concurrency_key) and lets at most opt_concurrency_limit tasks of one key hold
-- a queue message at once (queued or started). The other tasks of that key wait parked, in
-- order, without a message: a key with a backlog of thousands puts no more than its limit in the
-- queue, so another key's task waits behind those, not behind the backlog.
--
-- concurrency_keys counts each key's admitted tasks (tasks with a message, not finished); a row
-- lives while the key has admitted or parked tasks. Only pgflow._balance_concurrency_keys writes
-- it, when a transaction that parked or finished keyed tasks commits, locking the keys it touches
-- in key order (so concurrent transactions cannot deadlock on them).
create table pgflow.concurrency_keys (
  flow_slug text not null,
  step_slug text not null,
  concurrency_key text not null,
  admitted int not null default 0,
  primary key (flow_slug, step_slug, concurrency_key),
  foreign key (flow_slug, step_slug) references pgflow.steps (flow_slug, step_slug) on delete cascade,
  constraint concurrency_keys_admitted_nonnegative check (admitted >= 0)
);

-- The tasks waiting for their key's room, oldest first (parked_seq). not_before is when the task
-- may start at the earliest (its step's start delay, counted from when it was queued). A row is
-- gone when the task gets its message, or when it finishes without one (cancelled, skipped).
create table pgflow.parked_tasks (
  flow_slug text not null,
  step_slug text not null,
  concurrency_key text not null,
  parked_seq bigint generated always as identity,
  run_id uuid not null,
  task_index int not null,
  not_before timestamptz not null,
  primary key (flow_slug, step_slug, concurrency_key, parked_seq),
  constraint parked_tasks_task_is_unique unique (run_id, step_slug, task_index),
  foreign key (run_id, step_slug, task_index) references pgflow.step_tasks (run_id, step_slug, task_index)
    on delete cascade
);

-- What a transaction did to keyed tasks, for pgflow._pass_concurrency_places to act on when a
-- completion ends and pgflow._balance_concurrency_keys when the transaction commits: released
-- counts admitted tasks of the key that finished, parked says tasks of the key were parked,
-- gone_run_id/gone_task_index name a parked task that finished. Rows never outlive their
-- transaction, and each names it (xact), so the functions read their own transaction's rows
-- through the index, never the dead rows of the transactions before.
create table pgflow.concurrency_events (
  xact xid8 not null default pg_current_xact_id(),
  flow_slug text not null,
  step_slug text not null,
  concurrency_key text not null,
  released int not null default 0,
  parked boolean not null default false,
  gone_run_id uuid,
  gone_task_index int
);

create index concurrency_events_xact_idx on pgflow.concurrency_events (xact);

-- Notes what happened to a keyed task (engine 0018), a row trigger function on pgflow.step_tasks,
-- for pgflow._balance_concurrency_keys to settle when the transaction commits: a keyed task queued
-- again without a message (retry_run) is parked, with the step's start delay (new tasks are parked
-- by pgflow._park_keyed_tasks); an admitted task (one with a message) that finishes frees its
-- place, which pgflow._pass_concurrency_places gives to the next parked task of its key when it
-- completed (else the commit frees it); a parked task that finishes leaves its key's line. Its
-- triggers fire only for keyed tasks (their WHEN clauses), so a step without a key pays nothing.
create function pgflow._note_concurrency_event()
returns trigger
language plpgsql
set search_path = ''
as $$
begin
  if new.status in ('queued', 'started') then
    -- Queued again by retry_run, which leaves a keyed task without a message: it is parked.
    insert into pgflow.parked_tasks (flow_slug, step_slug, concurrency_key, run_id, task_index, not_before)
    select new.flow_slug, new.step_slug, new.concurrency_key, new.run_id, new.task_index,
      clock_timestamp() + make_interval(secs => coalesce(s.opt_start_delay, 0))
    from pgflow.steps as s
    where s.flow_slug = new.flow_slug and s.step_slug = new.step_slug;
    insert into pgflow.concurrency_events (flow_slug, step_slug, concurrency_key, parked)
    values (new.flow_slug, new.step_slug, new.concurrency_key, true);
  elsif old.message_id is null then
    insert into pgflow.concurrency_events (flow_slug, step_slug, concurrency_key, gone_run_id, gone_task_index)
    values (old.flow_slug, old.step_slug, old.concurrency_key, old.run_id, old.task_index);
  else
    insert into pgflow.concurrency_events (flow_slug, step_slug, concurrency_key, released)
    values (old.flow_slug, old.step_slug, old.concurrency_key, 1);
    perform set_config('pgflow.concurrency_passes', 'pending', true);
  end if;
  perform set_config('pgflow.concurrency_events', 'pending', true);
  return null;
end;
$$;

-- Only a move between waiting or running (queued, started) and finished counts.
create trigger step_tasks_keyed_status
after update of status on pgflow.step_tasks
for each row
when (old.concurrency_key is not null
  and (old.status in ('queued', 'started')) <> (new.status in ('queued', 'started')))
execute function pgflow._note_concurrency_event();

-- Settles a committing transaction's keyed tasks (engine 0018), a deferred constraint trigger on
-- pgflow.concurrency_events: its first firing takes every event of the transaction (later ones find
-- none pending) and, key by key in key order (so transactions never deadlock on the keys), counts
-- the places freed, drops finished tasks from the line, and gives the oldest parked tasks a message
-- while the key has room under its step's opt_concurrency_limit (no limit: all of them; a step's
-- start delay still applies). A parked task another transaction has locked (it is being cancelled,
-- and settles its key when it commits) is passed over. A key with nothing admitted and nothing
-- parked loses its row.
create function pgflow._balance_concurrency_keys()
returns trigger
language plpgsql
set search_path = ''
set enable_seqscan = off
as $$
declare
  v_key record;
  v_limit int;
  v_admitted int;
begin
  if current_setting('pgflow.concurrency_events', true) is distinct from 'pending' then
    return null;
  end if;
  perform set_config('pgflow.concurrency_events', '', true);

  for v_key in
    with taken as (
      delete from pgflow.concurrency_events as e where e.xact = pg_current_xact_id() returning e.*
    )
    select t.flow_slug, t.step_slug, t.concurrency_key, sum(t.released)::int as released,
      bool_or(t.parked) as parked,
      array_agg(t.gone_run_id) filter (where t.gone_run_id is not null) as gone_runs,
      array_agg(t.gone_task_index) filter (where t.gone_run_id is not null) as gone_indexes
    from taken as t
    group by t.flow_slug, t.step_slug, t.concurrency_key
    order by t.flow_slug, t.step_slug, t.concurrency_key
  loop
    -- GUARD: a key whose freed places all went to parked tasks (pgflow._pass_concurrency_places)
    -- has nothing left to settle; its row is not locked.
    continue when v_key.released = 0 and not v_key.parked and v_key.gone_runs is null;
    select s.opt_concurrency_limit into v_limit
    from pgflow.steps as s where s.flow_slug = v_key.flow_slug and s.step_slug = v_key.step_slug;
    continue when not found;  -- the flow was deleted in this transaction
    insert into pgflow.concurrency_keys (flow_slug, step_slug, concurrency_key)
    values (v_key.flow_slug, v_key.step_slug, v_key.concurrency_key)
    on conflict on constraint concurrency_keys_pkey do nothing;
    select k.admitted - v_key.released into v_admitted
    from pgflow.concurrency_keys as k
    where k.flow_slug = v_key.flow_slug and k.step_slug = v_key.step_slug
      and k.concurrency_key = v_key.concurrency_key
    for update;
    v_admitted := greatest(v_admitted, 0);

    -- The parked rows of tasks that finished leave the line. One that another transaction's
    -- pick has locked (it found the task locked by this one) stays: a pick passes over it, as
    -- its task is not queued, and it goes with the task when the run is pruned.
    if v_key.gone_runs is not null then
      delete from pgflow.parked_tasks as p
      where p.ctid = any (array(
        select x.ctid from pgflow.parked_tasks as x
        where x.run_id = any (v_key.gone_runs) and x.step_slug = v_key.step_slug
          and (x.run_id, x.task_index) in (
            select g.run_id, g.task_index from unnest(v_key.gone_runs, v_key.gone_indexes) as g (run_id, task_index)
          )
        for update of x skip locked
      ));
    end if;

    if (v_limit is null or v_admitted < v_limit) and exists (
      select 1 from pgflow.parked_tasks as p
      where p.flow_slug = v_key.flow_slug and p.step_slug = v_key.step_slug
        and p.concurrency_key = v_key.concurrency_key
    ) then
      v_admitted := v_admitted + pgflow._unpark_tasks(v_key.flow_slug, v_key.step_slug,
        v_key.concurrency_key, v_limit - v_admitted);
    end if;

    if v_admitted = 0 and not exists (
      select 1 from pgflow.parked_tasks as p
      join pgflow.step_tasks as t
        on t.run_id = p.run_id and t.step_slug = p.step_slug and t.task_index = p.task_index
      where p.flow_slug = v_key.flow_slug and p.step_slug = v_key.step_slug
        and p.concurrency_key = v_key.concurrency_key and t.status = 'queued'
    ) then
      delete from pgflow.concurrency_keys as k
      where k.flow_slug = v_key.flow_slug and k.step_slug = v_key.step_slug
        and k.concurrency_key = v_key.concurrency_key;
    else
      update pgflow.concurrency_keys as k set admitted = v_admitted
      where k.flow_slug = v_key.flow_slug and k.step_slug = v_key.step_slug
        and k.concurrency_key = v_key.concurrency_key;
    end if;
  end loop;
  return null;
end;
$$;

create constraint trigger concurrency_events_balance
after insert on pgflow.concurrency_events
deferrable initially deferred
for each row
execute function pgflow._balance_concurrency_keys();

-- The use of each keyed step's concurrency (engine 0018), for status, coverage, limits and the
-- dashboard: its route, its key path and limit per key, how many keys have tasks running or queued
-- (keys_active) and how many have tasks waiting for room (keys_waiting), how many tasks hold a
-- place (admitted) and how many wait parked (parked), and the key with the most parked tasks.
-- Every keyed step of the flow (of every flow when flow_slug is null), with or without work.
create function pgflow.concurrency_usage(flow_slug text default null)
returns table (
  flow_slug text,
  step_slug text,
  queue_name text,
  key_path text,
  limit_per_key int,
  keys_active int,
  keys_waiting int,
  admitted int,
  parked bigint,
  busiest_key text,
  busiest_parked bigint
)
language sql
stable
set search_path = ''
as $$
  select s.flow_slug, s.step_slug, s.queue_name, s.opt_concurrency_key, s.opt_concurrency_limit,
    coalesce(k.keys_active, 0), coalesce(p.keys_waiting, 0), coalesce(k.admitted, 0),
    coalesce(p.parked, 0), b.concurrency_key, b.parked
  from pgflow.steps as s
  left join lateral (
    select count(*) filter (where x.admitted > 0)::int as keys_active, sum(x.admitted)::int as admitted
    from pgflow.concurrency_keys as x
    where x.flow_slug = s.flow_slug and x.step_slug = s.step_slug
  ) as k on true
  left join lateral (
    select count(distinct x.concurrency_key)::int as keys_waiting, count(*) as parked
    from pgflow.parked_tasks as x
    join pgflow.step_tasks as t
      on t.run_id = x.run_id and t.step_slug = x.step_slug and t.task_index = x.task_index
    where x.flow_slug = s.flow_slug and x.step_slug = s.step_slug and t.status = 'queued'
  ) as p on true
  left join lateral (
    select x.concurrency_key, count(*) as parked
    from pgflow.parked_tasks as x
    join pgflow.step_tasks as t
      on t.run_id = x.run_id and t.step_slug = x.step_slug and t.task_index = x.task_index
    where x.flow_slug = s.flow_slug and x.step_slug = s.step_slug and t.status = 'queued'
    group by x.concurrency_key
    order by count(*) desc, x.concurrency_key
    limit 1
  ) as b on true
  where (concurrency_usage.flow_slug is null or s.flow_slug = concurrency_usage.flow_slug)
    and (s.opt_concurrency_key is not null or k.admitted > 0 or p.parked > 0)
  order by s.flow_slug, s.step_index
$$;

-- Gives the places of keyed tasks that finished to the oldest parked tasks of their keys (engine
-- 0018), at once: the parked tasks get their messages in the transaction that completed, so the
-- claim that follows a completion (complete_and_claim) can take them, and the keys' counts do not
-- change. complete_task and complete_tasks call it when pgflow._note_concurrency_event flagged a
-- freed place (a setting local to the transaction), so completions of tasks without a key pay one
-- setting read. Waits for no lock (pgflow._unpark_tasks passes over what another transaction
-- holds), and the keys' rows are only read. A place with no parked task to take it, or of a key
-- that holds more than its limit (lowered meanwhile), is freed when the transaction commits
-- (pgflow._balance_concurrency_keys).
create function pgflow._pass_concurrency_places()
returns void
language plpgsql
set search_path = ''
set enable_seqscan = off
as $$
declare
  v_key record;
  v_passed int;
begin
  if current_setting('pgflow.concurrency_passes', true) is distinct from 'pending' then
    return;
  end if;
  perform set_config('pgflow.concurrency_passes', '', true);
  for v_key in
    select e.flow_slug, e.step_slug, e.concurrency_key, sum(e.released)::int as released
    from pgflow.concurrency_events as e
    where e.xact = pg_current_xact_id() and e.released > 0
    group by e.flow_slug, e.step_slug, e.concurrency_key
    order by e.flow_slug, e.step_slug, e.concurrency_key
  loop
    -- GUARD: a key with no parked task has nothing to pass, and one above its limit (lowered
    -- meanwhile) passes nothing: the commit frees their places.
    continue when not exists (
      select 1 from pgflow.parked_tasks as p
      where p.flow_slug = v_key.flow_slug and p.step_slug = v_key.step_slug
        and p.concurrency_key = v_key.concurrency_key
    ) or not exists (
      select 1
      from pgflow.concurrency_keys as k
      join pgflow.steps as s on s.flow_slug = k.flow_slug and s.step_slug = k.step_slug
      where k.flow_slug = v_key.flow_slug and k.step_slug = v_key.step_slug
        and k.concurrency_key = v_key.concurrency_key
        and k.admitted <= coalesce(s.opt_concurrency_limit, k.admitted)
    );
    v_passed := pgflow._unpark_tasks(v_key.flow_slug, v_key.step_slug, v_key.concurrency_key,
      v_key.released);
    if v_passed > 0 then
      delete from pgflow.concurrency_events as e
      where e.xact = pg_current_xact_id() and e.flow_slug = v_key.flow_slug and e.step_slug = v_key.step_slug
        and e.concurrency_key = v_key.concurrency_key and e.released > 0;
      if v_key.released > v_passed then
        insert into pgflow.concurrency_events (flow_slug, step_slug, concurrency_key, released)
        values (v_key.flow_slug, v_key.step_slug, v_key.concurrency_key, v_key.released - v_passed);
      end if;
    end if;
  end loop;
end;
$$;

-- Creates the tasks of a keyed step (engine 0018) in the given runs, task_counts[i] of them in
-- run_ids[i] (one for a single step, one per element for a map): each takes the value of the
-- step's key in its run's input (the empty key when the input has none) and waits parked, in the
-- order given, with the step's start delay counted from now. Their keys are settled when the
-- transaction commits (pgflow._balance_concurrency_keys), which gives the first of them their
-- messages as far as each key has room. Called by pgflow._advance_run and pgflow.start_flows.
create function pgflow._park_keyed_tasks(
  flow_slug text,
  step_slug text,
  queue_name text,
  key_path text,
  delay_seconds int,
  run_ids uuid[],
  task_counts int[]
)
returns void
language plpgsql
volatile
set search_path = ''
set enable_seqscan = off
as $$
begin
  -- One statement, joining only the rows it inserts (a join with step_tasks itself could walk
  -- the whole table under a generic plan).
  with tasks as (
    insert into pgflow.step_tasks (run_id, flow_slug, step_slug, task_index, queue_name, concurrency_key)
    select r.run_id, _park_keyed_tasks.flow_slug, _park_keyed_tasks.step_slug, i, _park_keyed_tasks.queue_name,
      coalesce(jsonb_path_query_first(x.input, key_path::jsonpath) #>> '{}', '')
    from unnest(run_ids, task_counts) with ordinality as r (run_id, tasks, ord)
    join pgflow.runs as x on x.run_id = r.run_id
    cross join lateral generate_series(0, r.tasks - 1) as i
    returning run_id, task_index, concurrency_key
  ),
  parked as (
    insert into pgflow.parked_tasks (flow_slug, step_slug, concurrency_key, run_id, task_index, not_before)
    select _park_keyed_tasks.flow_slug, _park_keyed_tasks.step_slug, t.concurrency_key, t.run_id,
      t.task_index, clock_timestamp() + make_interval(secs => delay_seconds)
    from tasks as t
    join unnest(run_ids) with ordinality as r (run_id, ord) on r.run_id = t.run_id
    order by r.ord, t.task_index
    returning concurrency_key
  )
  insert into pgflow.concurrency_events (flow_slug, step_slug, concurrency_key, parked)
  select distinct _park_keyed_tasks.flow_slug, _park_keyed_tasks.step_slug, p.concurrency_key, true
  from parked as p;
  perform set_config('pgflow.concurrency_events', 'pending', true);
end;
$$;

-- Gives up to qty of a key's oldest parked tasks their messages (engine 0018): locks their parked
-- rows and tasks, passing over those another transaction holds (a task being cancelled), deletes
-- the parked rows and sends one message per task, in order, each visible at its not_before at the
-- earliest (its step's start delay), recorded on the task. A parked row and its task change
-- together (one transaction gives the task its message and deletes the row), so a task found
-- through a live parked row has no message yet: its row is never locked only to be found
-- admitted meanwhile (it would stay locked until this commits, and a claim of its message would
-- pass it over). Returns how many it sent; null qty: all. Called by
-- pgflow._pass_concurrency_places and pgflow._balance_concurrency_keys.
create function pgflow._unpark_tasks(flow_slug text, step_slug text, concurrency_key text, qty int)
returns int
language plpgsql
volatile
set search_path = ''
set enable_seqscan = off
as $$
declare
  v_seqs bigint[];
  v_runs uuid[];
  v_indexes int[];
  v_queues text[];
  v_not_befores timestamptz[];
  v_queue text;
  v_table text;
  v_message_id bigint;
  v_sent int := 0;
begin
  select array_agg(k.parked_seq order by k.parked_seq), array_agg(k.run_id order by k.parked_seq),
    array_agg(k.task_index order by k.parked_seq), array_agg(k.queue_name order by k.parked_seq),
    array_agg(k.not_before order by k.parked_seq)
  into v_seqs, v_runs, v_indexes, v_queues, v_not_befores
  from (
    select p.parked_seq, t.run_id, t.task_index, t.queue_name, p.not_before
    from pgflow.parked_tasks as p
    join pgflow.step_tasks as t
      on t.run_id = p.run_id and t.step_slug = p.step_slug and t.task_index = p.task_index
    where p.flow_slug = _unpark_tasks.flow_slug and p.step_slug = _unpark_tasks.step_slug
      and p.concurrency_key = _unpark_tasks.concurrency_key
      and t.status = 'queued' and t.message_id is null
    order by p.parked_seq
    limit qty
    for update of p, t skip locked
  ) as k;
  if v_seqs is null then
    return 0;
  end if;
  delete from pgflow.parked_tasks as p
  where p.flow_slug = _unpark_tasks.flow_slug and p.step_slug = _unpark_tasks.step_slug
    and p.concurrency_key = _unpark_tasks.concurrency_key and p.parked_seq = any (v_seqs);
  -- One message at a time: a plain insert costs less to plan than one statement for all, and
  -- most calls give one task its message.
  for i in 1 .. cardinality(v_seqs) loop
    if v_queue is distinct from v_queues[i] then
      v_queue := v_queues[i];
      v_table := pgflow.pgmq_table_name(v_queue);
    end if;
    execute format('insert into pgmq.%I (vt, message) values ($1, $2) returning msg_id', v_table)
    into v_message_id
    using greatest(clock_timestamp(), v_not_befores[i]),
      jsonb_build_object('flow_slug', flow_slug, 'run_id', v_runs[i], 'step_slug', step_slug,
        'task_index', v_indexes[i]);
    update pgflow.step_tasks as t set message_id = v_message_id
    where t.run_id = v_runs[i] and t.step_slug = _unpark_tasks.step_slug and t.task_index = v_indexes[i];
    v_sent := v_sent + 1;
  end loop;
  return v_sent;
end;
$$;

-- Rejects a malformed shape document with a clear error before anything is compared or written.
-- Called by ensure_flow_compiled.
create or replace function pgflow._validate_flow_shape(shape jsonb)
returns void
language plpgsql
immutable
set search_path = ''
as $$
declare
  v_step jsonb;
  v_index int := 0;
  v_duplicate text;
  v_option record;
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
    if v_step ? 'payloadSchema' and (jsonb_typeof(v_step -> 'payloadSchema') is distinct from 'object'
      or v_step ->> 'stepType' is distinct from 'signal') then
      raise exception 'Invalid flow shape: "payloadSchema" of step "%" must be a JSON Schema object of a signal step.',
        v_step ->> 'slug'
        using errcode = '22023';
    end if;
    v_index := v_index + 1;
  end loop;

  select s.value ->> 'slug' into v_duplicate
  from jsonb_array_elements(shape -> 'steps') as s
  group by s.value ->> 'slug' having count(*) > 1
  limit 1;
  if v_duplicate is not null then
    raise exception 'Invalid flow shape: step "%" appears more than once.', v_duplicate
      using errcode = '22023';
  end if;

  if shape ? 'inputSchema' and jsonb_typeof(shape -> 'inputSchema') is distinct from 'object' then
    raise exception 'Invalid flow shape: "inputSchema" must be a JSON Schema object, got %.',
      jsonb_typeof(shape -> 'inputSchema')
      using errcode = '22023';
  end if;

  -- Options must be whole numbers (flow options, then each step's), but for a step's
  -- concurrency key, a JSON path (engine 0018).
  for v_option in
    select o.key, o.value from jsonb_each(coalesce(shape -> 'options', '{}')) as o
    union all
    select o.key, o.value
    from jsonb_array_elements(shape -> 'steps') as s, jsonb_each(coalesce(s.value -> 'options', '{}')) as o
  loop
    if v_option.key = 'concurrencyKey' and jsonb_typeof(v_option.value) = 'string' then
      begin
        perform (v_option.value #>> '{}')::jsonpath;
      exception when syntax_error then
        raise exception 'Invalid flow shape: option "concurrencyKey" must be a JSON path into the run''s input, such as "$.tenant_id", got %.',
          v_option.value
          using errcode = '22023';
      end;
    elsif jsonb_typeof(v_option.value) <> 'number' or v_option.value::text !~ '^-?[0-9]+$' then
      raise exception 'Invalid flow shape: option "%" must be a whole number, got %.', v_option.key, v_option.value
        using errcode = '22023';
    end if;
  end loop;
end;
$$;

-- Moves every ready step of a run (created, no remaining dependencies) forward, in step order:
-- evaluates its condition once, then skips it, fails the run, completes it at once when it has no
-- tasks, or starts it (tasks + one message each; a keyed step's tasks are parked, engine 0018). A
-- signal step completes with the signal it received early, or starts waiting for one (no task, no
-- message). Skips and instant completions can ready more steps, so it repeats until a pass changes
-- nothing but starts. A run that started nothing may be finished, so then it tries to complete it.
-- Returns false when the run failed. Caller holds the run row lock.
create or replace function pgflow._advance_run(run_id uuid)
returns boolean
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_step record;
  v_target jsonb;
  v_again boolean := true;
  v_started boolean := false;
  v_payload jsonb;
begin
  while v_again loop
    v_again := false;
    for v_step in
      select ss.step_slug, ss.flow_slug, ss.initial_tasks, s.step_type, s.deps_count, s.queue_name,
        s.opt_start_delay, s.required_input_pattern, s.forbidden_input_pattern, s.when_unmet, r.input,
        s.opt_concurrency_key
      from pgflow.step_states as ss
      join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
      join pgflow.runs as r on r.run_id = ss.run_id
      where ss.run_id = _advance_run.run_id and ss.status = 'created' and ss.remaining_deps = 0
      order by s.step_index
    loop
      -- GUARD: conditions are evaluated once, now that the step is ready.
      if v_step.required_input_pattern is not null or v_step.forbidden_input_pattern is not null then
        if v_step.deps_count = 0 then
          v_target := v_step.input;
        else
          select coalesce(jsonb_object_agg(d.dep_slug, dep.output), '{}') into v_target
          from pgflow.deps as d
          join pgflow.step_states as dep on dep.run_id = _advance_run.run_id and dep.step_slug = d.dep_slug
          where d.flow_slug = v_step.flow_slug and d.step_slug = v_step.step_slug
            and dep.status = 'completed';
        end if;
        if not ((v_step.required_input_pattern is null or v_target @> v_step.required_input_pattern)
          and (v_step.forbidden_input_pattern is null or not v_target @> v_step.forbidden_input_pattern)) then
          if v_step.when_unmet = 'fail' then
            update pgflow.step_states as ss
            set status = 'failed', error_message = 'Condition not met', failed_at = clock_timestamp()
            where ss.run_id = _advance_run.run_id and ss.step_slug = v_step.step_slug
              and ss.status = 'created';
            continue when not found;
            perform pgflow._emit_event(run_id, 'step:failed', v_step.step_slug, 'failed');
            perform pgflow._fail_run(run_id);
            return false;
          elsif v_step.when_unmet = 'skip' then
            v_again := pgflow._skip_step(run_id, v_step.step_slug, 'condition_unmet', null) or v_again;
          else
            v_again := pgflow._skip_step_cascade(run_id, v_step.step_slug, 'condition_unmet', null) > 0
              or v_again;
          end if;
          continue;
        end if;
      end if;

      -- A signal step runs no task: it takes a signal that came early at once, else it waits.
      if v_step.step_type = 'signal' then
        -- GUARD: a skip-cascade earlier in this pass may have closed the step already.
        perform 1 from pgflow.step_states as ss
        where ss.run_id = _advance_run.run_id and ss.step_slug = v_step.step_slug and ss.status = 'created';
        continue when not found;
        update pgflow.signals as sg set used_at = clock_timestamp()
        where sg.run_id = _advance_run.run_id and sg.step_slug = v_step.step_slug
        returning sg.payload into v_payload;
        if found then
          perform pgflow._complete_step(run_id, v_step.step_slug, v_payload);
          v_again := true;
        else
          update pgflow.step_states as ss
          set status = 'started', started_at = clock_timestamp(), remaining_tasks = 1
          where ss.run_id = _advance_run.run_id and ss.step_slug = v_step.step_slug;
          perform pgflow._emit_event(run_id, 'step:started', v_step.step_slug, 'started');
        end if;
        continue;
      end if;

      if v_step.initial_tasks is null then
        raise exception 'Step "%" of run % is ready but its task count is unknown.', v_step.step_slug, run_id
          using hint = 'This is an engine bug: a dependent map learns its size when its dependency completes.';
      end if;
      if v_step.initial_tasks = 0 then
        perform pgflow._complete_step(run_id, v_step.step_slug,
          case when v_step.step_type = 'map' then '[]'::jsonb end);
        v_again := true;
        continue;
      end if;

      -- GUARD: a skip-cascade earlier in this pass may have closed the step already.
      update pgflow.step_states as ss
      set status = 'started', started_at = clock_timestamp(), remaining_tasks = ss.initial_tasks
      where ss.run_id = _advance_run.run_id and ss.step_slug = v_step.step_slug and ss.status = 'created';
      continue when not found;
      if v_step.opt_concurrency_key is null then
        perform pgflow._enqueue_step_tasks(run_id, v_step.flow_slug, v_step.step_slug, v_step.queue_name,
          v_step.initial_tasks, coalesce(v_step.opt_start_delay, 0));
      else
        -- A keyed step's tasks are parked under their key's value (engine 0018); they get their
        -- messages as their key has room, when this transaction commits.
        perform pgflow._park_keyed_tasks(v_step.flow_slug, v_step.step_slug, v_step.queue_name,
          v_step.opt_concurrency_key, coalesce(v_step.opt_start_delay, 0), array[run_id],
          array[v_step.initial_tasks]);
      end if;
      perform pgflow._emit_event(run_id, 'step:started', v_step.step_slug, 'started');
      v_started := true;
    end loop;
  end loop;

  if not v_started then
    perform pgflow._maybe_complete_run(run_id);
  end if;
  return true;
end;
$$;

-- A worker reports a task's output. The last task of a step completes the step (a map's output
-- is its task outputs in task order), which readies children and may complete the run.
-- Late callbacks (run finished, step closed, task not started) change nothing, and so does a
-- stale one: `attempt` (from claim_tasks) is not the task's current attempt. Either returns the
-- task's row unchanged; a stale one's attempts_count differs from `attempt`.
-- Locks run, step state and task (in that order, in one statement), then the task's message,
-- which it archives (since engine 0014; before, the next claim archived it, which cost more).
create or replace function pgflow.complete_task(run_id uuid, step_slug text, task_index int, output jsonb, attempt int)
returns setof pgflow.step_tasks
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_locked record;
  v_task pgflow.step_tasks;
  v_output_type text := coalesce(jsonb_typeof(output), 'SQL NULL');
begin
  select r.status as run_status, ss.status as step_status, ss.remaining_tasks, s.step_type, t as task,
    -- The first map step fed by this single step, if any (its output must then be an array).
    (select c.step_slug from pgflow.deps as d
     join pgflow.steps as c on c.flow_slug = d.flow_slug and c.step_slug = d.step_slug
     where s.step_type = 'single' and d.flow_slug = s.flow_slug and d.dep_slug = s.step_slug
       and c.step_type = 'map'
     order by c.step_index limit 1) as map_child
  into v_locked
  from pgflow.runs as r
  join pgflow.step_states as ss on ss.run_id = r.run_id and ss.step_slug = complete_task.step_slug
  join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
  join pgflow.step_tasks as t
    on t.run_id = r.run_id and t.step_slug = ss.step_slug and t.task_index = complete_task.task_index
  where r.run_id = complete_task.run_id
  for update of r, ss, t;
  if not found then
    if not exists (select 1 from pgflow.runs as r where r.run_id = complete_task.run_id) then
      raise exception 'Run % does not exist.', run_id using errcode = 'P0002';
    end if;
    raise exception 'Task % of step "%" in run % does not exist.', task_index, step_slug, run_id
      using errcode = 'P0002';
  end if;
  v_task := v_locked.task;

  -- GUARD: a callback of an earlier attempt is stale and changes nothing: since that attempt,
  -- the task failed and was retried, or stall recovery requeued it, and another claim started
  -- the attempt that is current now. A null attempt answers whichever attempt is current.
  if attempt is not null and v_task.attempts_count <> attempt then
    return next v_task;
    return;
  end if;

  -- GUARD: late callbacks are no-ops.
  if v_locked.run_status <> 'started' or v_locked.step_status <> 'started' or v_task.status <> 'started' then
    return next v_task;
    return;
  end if;

  -- GUARD: a single step that feeds a map must produce an array; anything else fails the run.
  if v_locked.map_child is not null and v_output_type <> 'array' then
    update pgflow.step_tasks as t
    set status = 'failed', output = complete_task.output, failed_at = clock_timestamp(),
      error_message = format('[TYPE_VIOLATION] Produced %s instead of array', v_output_type)
    where t.run_id = complete_task.run_id and t.step_slug = complete_task.step_slug
      and t.task_index = complete_task.task_index
    returning * into v_task;
    update pgflow.step_states as ss
    set status = 'failed', failed_at = clock_timestamp(), remaining_tasks = null,
      error_message = format('[TYPE_VIOLATION] Map step %s expects array input but dependency %s produced %s',
        v_locked.map_child, complete_task.step_slug, v_output_type)
    where ss.run_id = complete_task.run_id and ss.step_slug = complete_task.step_slug;
    perform pgflow._emit_event(run_id, 'step:failed', step_slug, 'failed');
    perform pgflow._fail_run(run_id);
    perform pgmq.archive(v_task.queue_name, v_task.message_id);
    return next v_task;
    return;
  end if;

  update pgflow.step_tasks as t
  set status = 'completed', output = complete_task.output, completed_at = clock_timestamp()
  where t.run_id = complete_task.run_id and t.step_slug = complete_task.step_slug
    and t.task_index = complete_task.task_index
  returning * into v_task;

  if v_locked.remaining_tasks > 1 then
    update pgflow.step_states as ss set remaining_tasks = ss.remaining_tasks - 1
    where ss.run_id = complete_task.run_id and ss.step_slug = complete_task.step_slug;
  elsif pgflow._complete_step(run_id, step_slug,
      case when v_locked.step_type = 'map' then (
        select jsonb_agg(t.output order by t.task_index)
        from pgflow.step_tasks as t
        where t.run_id = complete_task.run_id and t.step_slug = complete_task.step_slug
      ) else output end) then
    perform pgflow._advance_run(run_id);
  end if;
  -- The place a keyed task freed goes to its key's next parked task now (engine 0018).
  if current_setting('pgflow.concurrency_passes', true) = 'pending' then
    perform pgflow._pass_concurrency_places();
  end if;

  perform pgmq.archive(v_task.queue_name, v_task.message_id);
  return next v_task;
end;
$$;

-- Keeps a flow's options (retries, delays, timeouts) in step with the shape it was verified
-- against: options are not part of the compared shape, so an edited spec changes them in place,
-- with no recompile. A shape without top-level "options" (a hand-written one) changes no option,
-- the steps' neither; otherwise a step without an option inherits the flow's. Returns the changes, [{"step": null | slug, "option",
-- "from", "to"}] (null: the flow's default), and notifies them on the channel pgflow_flows. Tasks
-- claimed before keep the timeout of their claim. Since engine 0017 a step's options may hold its
-- limits (maxInFlight, rateLimit, ratePeriod; pgflow.step_limits): a step that has some gets
-- exactly those (set by the spec), a step without loses the ones a spec set before, and keeps
-- the ones an operator set. Since engine 0018 a step's options may hold its concurrency key
-- (concurrencyKey, a JSON path into the run's input, and concurrencyLimit, the tasks of one key
-- that may hold a message at once): new tasks take them; tasks parked before keep their key and
-- take the new limit. Called by _adopt_flow_description under the flow's definition lock.
create or replace function pgflow._apply_flow_options(flow_slug text, shape jsonb)
returns jsonb
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_flow jsonb := shape -> 'options';
  v_changes jsonb;
begin
  if v_flow is null or jsonb_typeof(v_flow) <> 'object' then
    return '[]'::jsonb;
  end if;

  with wanted as (
    -- The flow's options (an option the shape leaves out stays as it is), then every step's.
    select null::text as step_slug, -1 as step_index, o.option, o.ord, o.current, coalesce(o.wanted, o.current) as wanted
    from pgflow.flows as f,
      unnest(
        array['maxAttempts', 'baseDelay', 'timeout'],
        array[f.opt_max_attempts, f.opt_base_delay, f.opt_timeout],
        array[(v_flow ->> 'maxAttempts')::int, (v_flow ->> 'baseDelay')::int, (v_flow ->> 'timeout')::int]
      ) with ordinality as o (option, current, wanted, ord)
    where f.flow_slug = _apply_flow_options.flow_slug
    union all
    select s.step_slug, s.step_index, o.option, o.ord, o.current, o.wanted
    from jsonb_array_elements(shape -> 'steps') as e (step)
    join pgflow.steps as s on s.flow_slug = _apply_flow_options.flow_slug and s.step_slug = e.step ->> 'slug',
      unnest(
        array['maxAttempts', 'baseDelay', 'timeout', 'startDelay'],
        array[s.opt_max_attempts, s.opt_base_delay, s.opt_timeout, s.opt_start_delay],
        array[(e.step #>> '{options,maxAttempts}')::int, (e.step #>> '{options,baseDelay}')::int,
              (e.step #>> '{options,timeout}')::int, (e.step #>> '{options,startDelay}')::int]
      ) with ordinality as o (option, current, wanted, ord)
  ),
  limited as (
    -- Limits: the spec's where it sets some, none where it sets none over a spec's, else as they are.
    select s.step_slug, s.step_index, o.option, 4 + o.ord as ord, o.current,
      case
        when e.step -> 'options' ?| array['maxInFlight', 'rateLimit', 'ratePeriod'] then o.declared
        when l.set_by = 'spec' then null
        else o.current
      end as wanted
    from jsonb_array_elements(shape -> 'steps') as e (step)
    join pgflow.steps as s on s.flow_slug = _apply_flow_options.flow_slug and s.step_slug = e.step ->> 'slug'
    left join pgflow.step_limits as l on l.flow_slug = s.flow_slug and l.step_slug = s.step_slug,
      unnest(
        array['maxInFlight', 'rateLimit', 'ratePeriod'],
        array[l.max_in_flight, l.rate_limit, l.rate_period_s],
        array[(e.step #>> '{options,maxInFlight}')::int, (e.step #>> '{options,rateLimit}')::int,
              (e.step #>> '{options,ratePeriod}')::int]
      ) with ordinality as o (option, current, declared, ord)
  ),
  keyed as (
    -- A step's concurrency key and its limit per key (engine 0018): the spec's, or none.
    select s.step_slug, s.step_index, o.option, 7 + o.ord as ord, o.current, o.wanted
    from jsonb_array_elements(shape -> 'steps') as e (step)
    join pgflow.steps as s on s.flow_slug = _apply_flow_options.flow_slug and s.step_slug = e.step ->> 'slug',
      unnest(
        array['concurrencyKey', 'concurrencyLimit'],
        array[to_jsonb(s.opt_concurrency_key), to_jsonb(s.opt_concurrency_limit)],
        array[nullif(e.step #> '{options,concurrencyKey}', 'null'),
              nullif(e.step #> '{options,concurrencyLimit}', 'null')]
      ) with ordinality as o (option, current, wanted, ord)
  )
  select jsonb_agg(jsonb_build_object('step', w.step_slug, 'option', w.option, 'from', w.current, 'to', w.wanted)
      order by w.step_index, w.ord)
  into v_changes
  from (
    select w.step_slug, w.step_index, w.option, w.ord, to_jsonb(w.current) as current,
      to_jsonb(w.wanted) as wanted
    from wanted as w
    union all
    select l.step_slug, l.step_index, l.option, l.ord, to_jsonb(l.current), to_jsonb(l.wanted) from limited as l
    union all
    select * from keyed
  ) as w
  where w.current is distinct from w.wanted;

  -- A spec that limits a step owns its limits, even when they are the ones an operator set.
  update pgflow.step_limits as l set set_by = 'spec'
  from jsonb_array_elements(shape -> 'steps') as e (step)
  where l.flow_slug = _apply_flow_options.flow_slug and l.step_slug = e.step ->> 'slug'
    and e.step -> 'options' ?| array['maxInFlight', 'rateLimit', 'ratePeriod'] and l.set_by <> 'spec';
  if v_changes is null then
    return '[]'::jsonb;
  end if;

  update pgflow.flows as f
  set opt_max_attempts = coalesce((v_flow ->> 'maxAttempts')::int, f.opt_max_attempts),
    opt_base_delay = coalesce((v_flow ->> 'baseDelay')::int, f.opt_base_delay),
    opt_timeout = coalesce((v_flow ->> 'timeout')::int, f.opt_timeout)
  where f.flow_slug = _apply_flow_options.flow_slug;
  update pgflow.steps as s
  set opt_max_attempts = (e.step #>> '{options,maxAttempts}')::int,
    opt_base_delay = (e.step #>> '{options,baseDelay}')::int,
    opt_timeout = (e.step #>> '{options,timeout}')::int,
    opt_start_delay = (e.step #>> '{options,startDelay}')::int,
    opt_concurrency_key = e.step #>> '{options,concurrencyKey}',
    opt_concurrency_limit = (e.step #>> '{options,concurrencyLimit}')::int
  from jsonb_array_elements(shape -> 'steps') as e (step)
  where s.flow_slug = _apply_flow_options.flow_slug and s.step_slug = e.step ->> 'slug';
  -- The keys of a step whose limit per key changed are settled anew when this commits: their
  -- parked tasks take the room a higher limit (or none) gives.
  insert into pgflow.concurrency_events (flow_slug, step_slug, concurrency_key, parked)
  select k.flow_slug, k.step_slug, k.concurrency_key, true
  from pgflow.concurrency_keys as k
  where k.flow_slug = _apply_flow_options.flow_slug and k.step_slug in (
    select x ->> 'step' from jsonb_array_elements(v_changes) as x
    where x ->> 'option' in ('concurrencyKey', 'concurrencyLimit')
  );
  if found then
    perform set_config('pgflow.concurrency_events', 'pending', true);
  end if;
  perform pgflow._put_step_limits(flow_slug, c.step,
    case when e.step -> 'options' ?| array['maxInFlight', 'rateLimit', 'ratePeriod'] then (e.step #>> '{options,maxInFlight}')::int end,
    case when e.step -> 'options' ?| array['maxInFlight', 'rateLimit', 'ratePeriod'] then (e.step #>> '{options,rateLimit}')::int end,
    case when e.step -> 'options' ?| array['maxInFlight', 'rateLimit', 'ratePeriod'] then (e.step #>> '{options,ratePeriod}')::int end,
    'spec')
  from (select distinct x ->> 'step' as slug from jsonb_array_elements(v_changes) as x
        where x ->> 'option' in ('maxInFlight', 'rateLimit', 'ratePeriod')) as c (step)
  join jsonb_array_elements(shape -> 'steps') as e (step) on e.step ->> 'slug' = c.step;

  perform pg_notify('pgflow_flows', jsonb_build_object(
    'event', 'flow:options_updated', 'flow_slug', flow_slug, 'changes', v_changes
  )::text);
  return v_changes;
end;
$$;

-- Retries a failed run from where it failed. Its failed steps, and the steps it left unfinished
-- when it failed, run again: every task of theirs that did not complete (it failed, or the failure
-- cancelled it) is queued again with a fresh message (a keyed one is parked, engine 0018) and no
-- attempt used, keeping its last error; completed tasks and steps keep their outputs and do not run
-- again (in a map only the failed and unfinished elements run); skipped steps stay skipped. A step
-- that failed without a task (a condition with when_unmet = fail, a signal that did not come) is
-- ready again and decided anew, and a signal step that waits starts a new wait. The run is started
-- again (retry_count + 1, retried_at); one event, run:retried.
-- Refused, changing nothing: an unknown run (P0002), a run that is not failed, or one whose flow
-- has gained a step since it started (55000). Locks the run, its step states and its tasks, in
-- that order, as every callback does; then it sends the new messages.
create or replace function pgflow.retry_run(run_id uuid)
returns pgflow.runs
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_run pgflow.runs;
  v_added text;
  v_queue text;
  v_keys jsonb;
  v_sent record;
begin
  select * into v_run from pgflow.runs as r where r.run_id = retry_run.run_id for update;
  if not found then
    raise exception 'Run % does not exist.', run_id using errcode = 'P0002';
  end if;
  if v_run.status <> 'failed' then
    raise exception 'Run % is %; only a failed run can be retried.', run_id, v_run.status
      using errcode = '55000', hint = 'Nothing was changed.';
  end if;
  -- GUARD: the run's steps must still be its flow's (add_step can extend a flow-mode flow).
  select s.step_slug into v_added from pgflow.steps as s
  where s.flow_slug = v_run.flow_slug
    and not exists (
      select 1 from pgflow.step_states as ss where ss.run_id = retry_run.run_id and ss.step_slug = s.step_slug
    )
  order by s.step_index
  limit 1;
  if v_added is not null then
    raise exception 'Run % cannot be retried: flow "%" has changed since it started.', run_id, v_run.flow_slug
      using errcode = '55000', detail = format('Step "%s" was added to the flow after the run started.', v_added),
        hint = 'Nothing was changed. Start a new run.';
  end if;

  perform 1 from pgflow.step_states as ss
  where ss.run_id = retry_run.run_id and ss.status in ('created', 'started', 'failed')
  order by ss.step_slug
  for update;
  perform 1 from pgflow.step_tasks as t
  join pgflow.step_states as ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug
  where t.run_id = retry_run.run_id and ss.status in ('started', 'failed')
    and t.status in ('failed', 'cancelled')
  order by t.step_slug, t.task_index
  for update of t;

  -- The tasks that did not complete are queued again, each with a new message (visible now).
  for v_queue, v_keys in
    select t.queue_name, jsonb_agg(jsonb_build_object(
        'flow_slug', t.flow_slug, 'run_id', t.run_id, 'step_slug', t.step_slug, 'task_index', t.task_index
      ) order by t.step_slug, t.task_index)
    from pgflow.step_tasks as t
    join pgflow.step_states as ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug
    where t.run_id = retry_run.run_id and ss.status in ('started', 'failed')
      and t.status in ('failed', 'cancelled') and t.concurrency_key is null
    group by t.queue_name
    order by t.queue_name
  loop
    for v_sent in execute format(
      'insert into pgmq.%I (vt, message) select clock_timestamp(), k.value from jsonb_array_elements($1) as k'
      ' returning msg_id, message ->> ''step_slug'' as step_slug, (message ->> ''task_index'')::int as task_index',
      pgflow.pgmq_table_name(v_queue))
      using v_keys
    loop
      update pgflow.step_tasks as t
      set status = 'queued', message_id = v_sent.msg_id, attempts_count = 0, queued_at = clock_timestamp(),
        started_at = null, failed_at = null, output = null, last_worker_id = null, requeued_count = 0,
        last_requeued_at = null, permanently_stalled_at = null, claimed_timeout = null, lease_renewed_at = null
      where t.run_id = retry_run.run_id and t.step_slug = v_sent.step_slug and t.task_index = v_sent.task_index;
    end loop;
  end loop;

  -- A keyed task (engine 0018) is queued without a message: it is parked, and gets one when its
  -- key has room.
  update pgflow.step_tasks as t
  set status = 'queued', message_id = null, attempts_count = 0, queued_at = clock_timestamp(),
    started_at = null, failed_at = null, output = null, last_worker_id = null, requeued_count = 0,
    last_requeued_at = null, permanently_stalled_at = null, claimed_timeout = null, lease_renewed_at = null
  from pgflow.step_states as ss
  where t.run_id = retry_run.run_id and ss.run_id = t.run_id and ss.step_slug = t.step_slug
    and ss.status in ('started', 'failed') and t.status in ('failed', 'cancelled')
    and t.concurrency_key is not null;

  -- Steps with tasks run again (their unfinished tasks are queued); failed ones without (a
  -- condition, a signal) are ready again; a waiting signal step waits anew.
  with counts as (
    select ss.step_slug, ss.status, s.step_type, count(x.task_index)::int as tasks,
      count(x.task_index) filter (where x.status <> 'completed')::int as unfinished
    from pgflow.step_states as ss
    join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    left join pgflow.step_tasks as x on x.run_id = ss.run_id and x.step_slug = ss.step_slug
    where ss.run_id = retry_run.run_id and ss.status in ('started', 'failed')
    group by ss.step_slug, ss.status, s.step_type
  )
  update pgflow.step_states as ss
  set status = case when c.status = 'failed' and c.tasks = 0 then 'created' else 'started' end,
    remaining_tasks = case when c.tasks > 0 then c.unfinished when c.status = 'started' then ss.remaining_tasks end,
    started_at = case when c.step_type = 'signal' then clock_timestamp() else ss.started_at end,
    failed_at = null, error_message = null
  from counts as c
  where ss.run_id = retry_run.run_id and ss.step_slug = c.step_slug;

  update pgflow.runs as r
  set status = 'started', failed_at = null, retry_count = r.retry_count + 1, retried_at = clock_timestamp()
  where r.run_id = retry_run.run_id;
  perform pgflow._emit_event(run_id, 'run:retried', null, 'started');
  -- Steps ready but never started when the run failed, and the ones made ready above.
  perform pgflow._advance_run(run_id);

  select * into v_run from pgflow.runs as r where r.run_id = retry_run.run_id;
  return v_run;
end;
$$;

-- Completes a batch of tasks in one call, as complete_task would one after another (a worker
-- reports the results it collected together). Returns each task's row afterwards, in input order.
--
-- The common case is done set-based, a handful of statements for the whole batch: a started task of
-- a single step whose children are all plain single steps (no condition, not a map). Its step
-- completes, every child whose last dependency finished starts (one message insert per queue for
-- the batch; a child with a concurrency key, engine 0018, is not plain), the tasks' messages are
-- archived (one call per queue), and runs with no step left complete. So are the tasks of a map
-- step that has more tasks left than the batch holds of it (engine 0014): they only count their
-- step down. Every other task (a map task that may finish its step, a step with a conditional or
-- map child, a late callback of a finished run) goes through complete_task, after the set-based
-- ones, in input order; so does a batch that names a task twice, and a batch of one (complete_task
-- is cheaper for a single task). `attempts` fences each result as complete_task's `attempt` does: a
-- stale one changes nothing and its row comes back unchanged.
--
-- A task that does not exist raises complete_task's error and changes nothing. Locks every run,
-- step state and task of the batch first, in key order, so concurrent batches cannot deadlock. The
-- rows locked are updated by their row ids (ctid; stable while we hold the lock), and the planner
-- settings keep every plan index-driven and its joins in the written order: these tables grow from
-- empty faster than autovacuum analyses them, and a sequential scan per batch would grow with them.
create or replace function pgflow.complete_tasks(
  run_ids uuid[], step_slugs text[], task_indexes int[], outputs jsonb[], attempts int[]
)
returns setof pgflow.step_tasks
language plpgsql
volatile
set search_path = ''
set enable_seqscan = off
set plan_cache_mode = force_generic_plan
set join_collapse_limit = 1
as $$
declare
  v_count int := coalesce(cardinality(run_ids), 0);
  v_batch record;
  v_started record;
  v_missing record;
  v_queue text;
  v_finished uuid[];
  v_general int[];
  v_attempts int[];
  v_map_positions bigint[];
  v_map_task_rows tid[];
  v_map_state_rows tid[];
  v_map_queues text[];
  v_map_messages bigint[];
  i int;
begin
  if coalesce(cardinality(step_slugs), 0) <> v_count or coalesce(cardinality(task_indexes), 0) <> v_count
    or coalesce(cardinality(outputs), 0) <> v_count
    or (attempts is not null and coalesce(cardinality(attempts), 0) <> v_count) then
    raise exception 'complete_tasks needs arrays of one length (got % run ids, % step slugs, % task indexes, % outputs, % attempts).',
      v_count, coalesce(cardinality(step_slugs), 0), coalesce(cardinality(task_indexes), 0),
      coalesce(cardinality(outputs), 0), coalesce(cardinality(attempts), v_count)
      using errcode = '22023';
  end if;
  if v_count = 0 then
    return;
  end if;
  -- Elements are paired by position, and the general path indexes them from 1.
  if array_ndims(run_ids) <> 1 or array_lower(run_ids, 1) <> 1
    or array_ndims(step_slugs) <> 1 or array_lower(step_slugs, 1) <> 1
    or array_ndims(task_indexes) <> 1 or array_lower(task_indexes, 1) <> 1
    or array_ndims(outputs) <> 1 or array_lower(outputs, 1) <> 1
    or (attempts is not null and (array_ndims(attempts) <> 1 or array_lower(attempts, 1) <> 1)) then
    raise exception 'complete_tasks needs one-dimensional arrays that start at index 1.'
      using errcode = '22023';
  end if;
  -- A null attempts array answers whichever attempts are current, as null elements do.
  v_attempts := coalesce(attempts, array_fill(null::int, array[v_count]));
  if v_count = 1 then
    return query select * from pgflow.complete_task(run_ids[1], step_slugs[1], task_indexes[1], outputs[1],
      v_attempts[1]);
    return;
  end if;

  with locked as (
    select u.ord, u.output, r.run_id, ss.flow_slug, ss.step_slug, t.task_index,
      t.ctid as task_row, ss.ctid as state_row,
      r.status = 'started' and ss.status = 'started' and t.status = 'started'
        and (u.attempt is null or u.attempt = t.attempts_count) as live,
      s.step_type = 'map' as mapped, ss.remaining_tasks,
      s.step_type = 'single' and not exists (
        select 1 from pgflow.deps as d
        join pgflow.steps as c on c.flow_slug = d.flow_slug and c.step_slug = d.step_slug
        where d.flow_slug = s.flow_slug and d.dep_slug = s.step_slug
          and (c.step_type <> 'single' or c.required_input_pattern is not null
            or c.forbidden_input_pattern is not null or c.opt_concurrency_key is not null)
      ) as plain
    -- Joined in this order (join_collapse_limit), each by its whole key: a task by the key
    -- the caller sends, never by its step alone (a big map step has thousands).
    from unnest(run_ids, step_slugs, task_indexes, outputs, v_attempts) with ordinality
      as u (run_id, step_slug, task_index, output, attempt, ord)
    join pgflow.step_tasks as t
      on t.run_id = u.run_id and t.step_slug = u.step_slug and t.task_index = u.task_index
    join pgflow.step_states as ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug
    join pgflow.runs as r on r.run_id = t.run_id
    join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    order by r.run_id, ss.step_slug, t.task_index
    for update of r, ss, t
  )
  select count(*) as found,
    count(distinct (l.run_id, l.step_slug, l.task_index)) as distinct_found,
    array_agg(l.ord order by l.ord) filter (where l.live and l.plain) as positions,
    array_agg(l.run_id order by l.ord) filter (where l.live and l.plain) as run_ids,
    array_agg(l.flow_slug order by l.ord) filter (where l.live and l.plain) as flow_slugs,
    array_agg(l.step_slug order by l.ord) filter (where l.live and l.plain) as step_slugs,
    array_agg(l.output order by l.ord) filter (where l.live and l.plain) as outputs,
    array_agg(l.task_row order by l.ord) filter (where l.live and l.plain) as task_rows,
    array_agg(l.state_row order by l.ord) filter (where l.live and l.plain) as state_rows,
    array_agg(l.ord order by l.ord) filter (where l.live and not l.plain) as general,
    -- Map tasks that do not finish their step here (fewer of its tasks in the batch than it has
    -- left) only count down their step.
    array_agg(l.ord order by l.ord) filter (where l.live and l.mapped) as map_positions,
    array_agg(l.task_row order by l.ord) filter (where l.live and l.mapped) as map_task_rows,
    array_agg(l.state_row order by l.ord) filter (where l.live and l.mapped) as map_state_rows,
    array_agg(l.remaining_tasks order by l.ord) filter (where l.live and l.mapped) as map_remaining
  into v_batch
  from locked as l;

  -- GUARD: every task must exist; the error names the first missing one, as complete_task would.
  if v_batch.found < v_count then
    select u.run_id, u.step_slug, u.task_index into v_missing
    from unnest(run_ids, step_slugs, task_indexes) with ordinality as u (run_id, step_slug, task_index, ord)
    where not exists (
      select 1 from pgflow.step_tasks as t
      where t.run_id = u.run_id and t.step_slug = u.step_slug and t.task_index = u.task_index
    )
    order by u.ord
    limit 1;
    if not exists (select 1 from pgflow.runs as r where r.run_id = v_missing.run_id) then
      raise exception 'Run % does not exist.', v_missing.run_id using errcode = 'P0002';
    end if;
    raise exception 'Task % of step "%" in run % does not exist.', v_missing.task_index,
      v_missing.step_slug, v_missing.run_id using errcode = 'P0002';
  end if;

  -- GUARD: a task named twice is completed once, by the general path (the repeat is a late
  -- callback there).
  if v_batch.distinct_found < v_count then
    v_general := array(select generate_series(1, v_count));
  else
    v_general := v_batch.general;
    -- The map tasks of a step with more tasks left than the batch holds complete set-based:
    -- their step only counts down, as complete_task would do for each (no event, no child).
    select array_agg(x.ord order by x.ord), array_agg(x.task_row order by x.ord),
      array_agg(x.state_row order by x.ord)
    into v_map_positions, v_map_task_rows, v_map_state_rows
    from (
      select m.ord, m.task_row, m.state_row, m.remaining,
        count(*) over (partition by m.state_row) as in_batch
      from unnest(v_batch.map_positions, v_batch.map_task_rows, v_batch.map_state_rows,
        v_batch.map_remaining) as m (ord, task_row, state_row, remaining)
    ) as x
    where x.in_batch < x.remaining;
    if v_map_positions is not null then
      v_general := array(select g from unnest(v_general) as g where not (g = any (v_map_positions)));
      if cardinality(v_general) = 0 then
        v_general := null;
      end if;
    end if;
  end if;

  if v_batch.positions is not null and v_batch.distinct_found = v_count then
    -- Tasks, their steps, the children's dependency counts (a child whose last dependencies
    -- all finish in this batch starts once) and the runs' step counts, in one statement.
    with fast as (
      select f.*
      from unnest(v_batch.positions, v_batch.run_ids, v_batch.flow_slugs, v_batch.step_slugs,
        v_batch.outputs, v_batch.task_rows, v_batch.state_rows)
        as f (position, run_id, flow_slug, step_slug, output, task_row, state_row)
    ),
    done as (
      update pgflow.step_tasks as t
      set status = 'completed', output = f.output, completed_at = clock_timestamp()
      from fast as f
      where t.ctid = any (v_batch.task_rows) and t.ctid = f.task_row
      returning t.queue_name, t.message_id
    ),
    closed as (
      update pgflow.step_states as ss
      set status = 'completed', output = f.output, remaining_tasks = 0, completed_at = clock_timestamp()
      from fast as f
      where ss.ctid = any (v_batch.state_rows) and ss.ctid = f.state_row
    ),
    edges as (
      -- last: the batch position of the child's last finishing parent (where its start belongs).
      select f.run_id, d.step_slug, count(*)::int as finished, max(f.position) as last
      from fast as f
      join pgflow.deps as d on d.flow_slug = f.flow_slug and d.dep_slug = f.step_slug
      group by f.run_id, d.step_slug
    ),
    children as (
      update pgflow.step_states as c
      set remaining_deps = c.remaining_deps - e.finished,
        status = case when c.remaining_deps = e.finished then 'started' else c.status end,
        started_at = case when c.remaining_deps = e.finished then clock_timestamp() else c.started_at end,
        remaining_tasks = case when c.remaining_deps = e.finished then c.initial_tasks else c.remaining_tasks end
      from edges as e
      where c.run_id = e.run_id and c.step_slug = e.step_slug and c.status = 'created'
      returning c.run_id, c.flow_slug, c.step_slug, c.remaining_deps, e.last
    ),
    counted as (
      update pgflow.runs as r set remaining_steps = r.remaining_steps - n.finished
      from (select f.run_id, count(*)::int as finished from fast as f group by f.run_id) as n
      where r.run_id = n.run_id
      returning r.run_id, r.remaining_steps
    )
    select array_agg(c.run_id order by c.run_id, s.step_index) as run_ids,
      array_agg(c.flow_slug order by c.run_id, s.step_index) as flow_slugs,
      array_agg(c.step_slug order by c.run_id, s.step_index) as step_slugs,
      array_agg(s.queue_name order by c.run_id, s.step_index) as queue_names,
      array_agg(coalesce(s.opt_start_delay, 0) order by c.run_id, s.step_index) as delays,
      array_agg(c.last order by c.run_id, s.step_index) as positions,
      array_agg(s.step_index order by c.run_id, s.step_index) as step_indexes,
      (select array_agg(n.run_id) from counted as n where n.remaining_steps = 0) as finished_runs,
      (select array_agg(d.queue_name order by d.message_id) from done as d) as done_queues,
      (select array_agg(d.message_id order by d.message_id) from done as d) as done_messages
    into v_started
    from children as c
    join pgflow.steps as s on s.flow_slug = c.flow_slug and s.step_slug = c.step_slug
    where c.remaining_deps = 0;

    -- One message per started child (a single step has one task), one insert per queue; the
    -- task rows are paired with their messages by the task key the message carries.
    for v_queue in select distinct q.name from unnest(v_started.queue_names) as q (name) order by 1 loop
      execute format(
        $q$
          with sent as (
            insert into pgmq.%I (vt, message)
            select clock_timestamp() + make_interval(secs => x.delay),
              jsonb_build_object('flow_slug', x.flow_slug, 'run_id', x.run_id, 'step_slug', x.step_slug, 'task_index', 0)
            from unnest($1::uuid[], $2::text[], $3::text[], $4::int[], $5::text[])
              as x (run_id, flow_slug, step_slug, delay, queue_name)
            where x.queue_name = $6
            returning msg_id, message
          )
          insert into pgflow.step_tasks (run_id, flow_slug, step_slug, task_index, message_id, queue_name)
          select (s.message ->> 'run_id')::uuid, s.message ->> 'flow_slug', s.message ->> 'step_slug', 0,
            s.msg_id, $6
          from sent as s
        $q$,
        pgflow.pgmq_table_name(v_queue)
      )
      using v_started.run_ids, v_started.flow_slugs, v_started.step_slugs, v_started.delays,
        v_started.queue_names, v_queue;
    end loop;

    -- The completed tasks' messages are archived at once, one call per queue.
    for v_queue in select distinct q.name from unnest(v_started.done_queues) as q (name) order by 1 loop
      perform pgmq.archive(v_queue, array(
        select m.message_id from unnest(v_started.done_queues, v_started.done_messages) as m (queue_name, message_id)
        where m.queue_name = v_queue));
    end loop;

    -- The events pgflow._emit_event would send, in one statement, and on each run's channel in
    -- the order completing these tasks one by one would send them: a completion, then the
    -- starts it caused.
    perform pg_notify(
      'pgflow_run_' || replace(e.run_id::text, '-', ''),
      json_build_object('event', e.event, 'run_id', e.run_id, 'step_slug', e.step_slug, 'status', e.status)::text
    )
    from (
      select f.position, 1 as phase, 0 as step_index, f.run_id, 'step:completed' as event, f.step_slug,
        'completed' as status
      from unnest(v_batch.positions, v_batch.run_ids, v_batch.step_slugs) as f (position, run_id, step_slug)
      union all
      select c.position, 2, c.step_index, c.run_id, 'step:started', c.step_slug, 'started'
      from unnest(v_started.positions, v_started.step_indexes, v_started.run_ids, v_started.step_slugs)
        as c (position, step_index, run_id, step_slug)
    ) as e
    order by e.position, e.phase, e.step_index;

    -- Runs with no step left complete, as pgflow._maybe_complete_run does for one.
    if v_started.finished_runs is not null then
      with finished as (
        update pgflow.runs as r
        set status = 'completed', completed_at = clock_timestamp(), output = (
          select jsonb_object_agg(ss.step_slug, ss.output)
          from pgflow.step_states as ss
          where ss.run_id = r.run_id and ss.status = 'completed'
            and not exists (
              select 1 from pgflow.deps as d where d.flow_slug = ss.flow_slug and d.dep_slug = ss.step_slug
            )
        )
        -- By key alone: these runs are started and locked (their tasks were live), and a
        -- condition on the status would let a generic plan walk the index of started runs.
        where r.run_id = any (v_started.finished_runs) and r.remaining_steps = 0
        returning r.run_id
      )
      select array_agg(f.run_id order by f.run_id) into v_finished from finished as f;
      perform pg_notify(
        'pgflow_run_' || replace(f.run_id::text, '-', ''),
        json_build_object('event', 'run:completed', 'run_id', f.run_id, 'step_slug', null, 'status', 'completed')::text
      )
      from unnest(v_finished) as f (run_id);
    end if;
  end if;

  if v_map_positions is not null then
    with counted as (
      update pgflow.step_states as ss set remaining_tasks = ss.remaining_tasks - c.n
      from (
        select m.state_row, count(*)::int as n from unnest(v_map_state_rows) as m (state_row)
        group by m.state_row
      ) as c
      where ss.ctid = any (v_map_state_rows) and ss.ctid = c.state_row
    ),
    done as (
      update pgflow.step_tasks as t
      set status = 'completed', output = outputs[m.ord], completed_at = clock_timestamp()
      from unnest(v_map_positions, v_map_task_rows) as m (ord, task_row)
      where t.ctid = any (v_map_task_rows) and t.ctid = m.task_row
      returning t.queue_name, t.message_id
    )
    select array_agg(d.queue_name order by d.message_id), array_agg(d.message_id order by d.message_id)
    into v_map_queues, v_map_messages
    from done as d;
    for v_queue in select distinct q.name from unnest(v_map_queues) as q (name) order by 1 loop
      perform pgmq.archive(v_queue, array(
        select m.message_id from unnest(v_map_queues, v_map_messages) as m (queue_name, message_id)
        where m.queue_name = v_queue));
    end loop;
  end if;

  if v_general is not null then
    foreach i in array v_general loop
      perform pgflow.complete_task(run_ids[i], step_slugs[i], task_indexes[i], outputs[i], v_attempts[i]);
    end loop;
  end if;
  -- The places keyed tasks freed go to their keys' next parked tasks now (engine 0018).
  if current_setting('pgflow.concurrency_passes', true) = 'pending' then
    perform pgflow._pass_concurrency_places();
  end if;

  return query
  select t.*
  from unnest(run_ids, step_slugs, task_indexes) with ordinality as u (run_id, step_slug, task_index, ord)
  join pgflow.step_tasks as t
    on t.run_id = u.run_id and t.step_slug = u.step_slug and t.task_index = u.task_index
  order by u.ord;
end;
$$;

-- Starts many runs of one flow in one call (engine 0014), as start_flow would for each input in
-- turn, in one transaction, and returns the runs in input order. With idempotency_keys (one per
-- input, null elements for none), an input whose key some run of this flow already has returns
-- that run as it is and starts nothing (so does a key repeated in the call: its first input
-- wins), also when calls race. Set-based when every root step is a single step without a
-- condition (one message insert per root step for all runs); otherwise each new run moves
-- forward as start_flow moves one. An input that is SQL NULL, or not an array where a root map
-- step maps it, raises naming its position (from 1), and nothing starts.
-- Holds the flow's definition lock shared, as start_flow does, and keeps the caller's trace
-- context as start_flow does (engine 0016).
create or replace function pgflow.start_flows(flow_slug text, inputs jsonb[], idempotency_keys text[] default null)
returns setof pgflow.runs
language plpgsql
volatile
set search_path = ''
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
as $$
-- The conflict target names columns that are parameters too; every other use is qualified.
#variable_conflict use_column
declare
  v_count int := coalesce(cardinality(inputs), 0);
  v_root_map text;
  v_bad record;
  v_ids uuid[];
  v_new uuid[];
  v_plain boolean;
  v_root record;
  v_traceparent text := substring(current_setting('pgflow.traceparent', true)
    from '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$');
begin
  perform pg_advisory_xact_lock_shared(1, hashtext(lower(flow_slug)));
  if not exists (select 1 from pgflow.flows as f where f.flow_slug = start_flows.flow_slug) then
    raise exception 'Flow "%" does not exist.', flow_slug
      using errcode = 'P0002', hint = 'Check the slug (it is case-sensitive) or compile the flow first.';
  end if;
  if v_count = 0 then
    return;
  end if;
  if array_ndims(inputs) <> 1 or array_lower(inputs, 1) <> 1
    or (idempotency_keys is not null and (cardinality(idempotency_keys) <> v_count
      or array_ndims(idempotency_keys) <> 1 or array_lower(idempotency_keys, 1) <> 1)) then
    raise exception 'start_flows needs one-dimensional arrays that start at index 1, one key per input (got % inputs, % keys).',
      v_count, coalesce(cardinality(idempotency_keys), 0)
      using errcode = '22023';
  end if;
  -- GUARD: every input is checked before anything is written.
  select i.n into v_bad from unnest(inputs) with ordinality as i (input, n)
  where i.input is null order by i.n limit 1;
  if found then
    raise exception 'Input % of the runs of flow "%" must not be SQL NULL.', v_bad.n, flow_slug
      using errcode = '22004', hint = 'Pass a JSON value; ''null''::jsonb is a valid JSON input.';
  end if;
  select s.step_slug into v_root_map from pgflow.steps as s
  where s.flow_slug = start_flows.flow_slug and s.step_type = 'map' and s.deps_count = 0
  order by s.step_index limit 1;
  if v_root_map is not null then
    select i.n, jsonb_typeof(i.input) as kind into v_bad from unnest(inputs) with ordinality as i (input, n)
    where jsonb_typeof(i.input) <> 'array' order by i.n limit 1;
    if found then
      raise exception 'Flow "%" maps its input in step "%", so input % must be a JSON array, got %.',
        flow_slug, v_root_map, v_bad.n, v_bad.kind
        using errcode = '22023';
    end if;
  end if;

  v_ids := array(select gen_random_uuid() from generate_series(1, v_count));
  with started as (
    insert into pgflow.runs (run_id, flow_slug, input, remaining_steps, idempotency_key, traceparent)
    select w.run_id, start_flows.flow_slug, w.input,
      (select count(*) from pgflow.steps as s where s.flow_slug = start_flows.flow_slug), w.key,
      v_traceparent
    from unnest(v_ids, inputs, coalesce(idempotency_keys, array_fill(null::text, array[v_count])))
      with ordinality as w (run_id, input, key, n)
    order by w.n
    on conflict (flow_slug, idempotency_key) where idempotency_key is not null do nothing
    returning run_id
  )
  select coalesce(array_agg(s.run_id), '{}') into v_new from started as s;

  if cardinality(v_new) > 0 then
    select count(*) > 0 and bool_and(s.step_type = 'single' and s.required_input_pattern is null
        and s.forbidden_input_pattern is null) into v_plain
    from pgflow.steps as s where s.flow_slug = start_flows.flow_slug and s.deps_count = 0;
    -- Plain root steps start in the same statement (each has its one task, queued below).
    insert into pgflow.step_states (run_id, flow_slug, step_slug, remaining_deps, initial_tasks,
      status, started_at, remaining_tasks)
    select r.run_id, s.flow_slug, s.step_slug, s.deps_count,
      case
        when s.step_type in ('single', 'signal') then 1
        when s.deps_count = 0 then jsonb_array_length(r.input)
      end,
      case when v_plain and s.deps_count = 0 then 'started' else 'created' end,
      case when v_plain and s.deps_count = 0 then clock_timestamp() end,
      case when v_plain and s.deps_count = 0 then 1 end
    from pgflow.runs as r
    join pgflow.steps as s on s.flow_slug = r.flow_slug
    where r.run_id = any (v_new);
    perform pg_notify(
      'pgflow_run_' || replace(r.run_id::text, '-', ''),
      json_build_object('event', 'run:started', 'run_id', r.run_id, 'step_slug', null, 'status', 'started')::text
    )
    from unnest(v_new) as r (run_id);

    if v_plain then
      -- Every root step starts with one task in every new run: one message insert per root
      -- step, its task rows paired with their messages by the task key the message carries.
      for v_root in
        select s.step_slug, s.queue_name, coalesce(s.opt_start_delay, 0) as delay, s.opt_concurrency_key
        from pgflow.steps as s
        where s.flow_slug = start_flows.flow_slug and s.deps_count = 0
        order by s.step_index
      loop
        if v_root.opt_concurrency_key is not null then
          -- A keyed root step's tasks are parked under their key's value (engine 0018).
          perform pgflow._park_keyed_tasks(flow_slug, v_root.step_slug, v_root.queue_name,
            v_root.opt_concurrency_key, v_root.delay, v_new, array_fill(1, array[cardinality(v_new)]));
        else
          execute format(
            $q$
              with sent as (
                insert into pgmq.%I (vt, message)
                select clock_timestamp() + make_interval(secs => $1),
                  jsonb_build_object('flow_slug', $2, 'run_id', r.run_id, 'step_slug', $3, 'task_index', 0)
                from unnest($4::uuid[]) as r (run_id)
                returning msg_id, message
              )
              insert into pgflow.step_tasks (run_id, flow_slug, step_slug, task_index, message_id, queue_name)
              select (s.message ->> 'run_id')::uuid, $2, $3, 0, s.msg_id, $5
              from sent as s
            $q$,
            pgflow.pgmq_table_name(v_root.queue_name)
          )
          using v_root.delay, flow_slug, v_root.step_slug, v_new, v_root.queue_name;
        end if;
        perform pg_notify(
          'pgflow_run_' || replace(r.run_id::text, '-', ''),
          json_build_object('event', 'step:started', 'run_id', r.run_id, 'step_slug', v_root.step_slug,
            'status', 'started')::text
        )
        from unnest(v_new) as r (run_id);
      end loop;
    else
      perform pgflow._advance_run(r.run_id) from unnest(v_new) as r (run_id);
    end if;
  end if;

  return query
  select r.*
  from unnest(v_ids, idempotency_keys) with ordinality as w (run_id, key, n)
  cross join lateral (
    select x.* from pgflow.runs as x where x.run_id = w.run_id
    union all
    select x.* from pgflow.runs as x
    where w.key is not null and x.flow_slug = start_flows.flow_slug and x.idempotency_key = w.key
    limit 1
  ) as r
  order by w.n;
end;
$$;

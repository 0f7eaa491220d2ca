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
security definer
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

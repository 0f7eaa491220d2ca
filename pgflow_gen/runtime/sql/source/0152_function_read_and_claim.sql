-- The claim in one call (engine 0012): reads up to qty messages of queue_name and claims their
-- tasks (pgflow._claim_messages), in one statement, so a worker polls with one round trip and one
-- commit instead of two. The selector follows claim_tasks's rules and is checked before anything
-- is read. Since engine 0014 it reads with the lease its claims set (the steps' timeout + 2 s,
-- when they agree), so a claimed message is touched once; a message it read and did not claim
-- (foreign, or another claim's) is hidden for vt seconds, as pgmq.read would (held ones keep
-- their hold), and named in a notice (JSON detail: unclaimed_message_ids), after the claim's own notices. When it
-- read fewer than qty, another notice says when the queue's next hidden message shows again
-- (JSON detail: next_visible_in_s), so that the worker wakes then.
-- Since engine 0031, while some started run of the flow has a priority (an index of such runs
-- says so, for the cost of one probe), it first reads the queue's visible messages that carry
-- one, the highest first (pgflow._read_prioritised), then first in, first out, as pgmq.read
-- orders them: a ready task of a higher-priority run is claimed before the tasks of lower ones
-- in its queue, by every worker. A message not yet visible waits its time, whatever its run's
-- priority.
-- A step-queued flow's step with limits (engine 0017) is read only as far as there is room under
-- them (pgflow._step_capacity), so messages beyond a limit stay in the queue, untouched and in
-- order: a notice says so (JSON detail: limited_step, wanted, allowed), and the next-visible
-- notice then says when to ask again.
-- Locks as claim_tasks does (task rows before PGMQ rows; pgmq.read skips locked messages), and
-- holds the read's message locks until it commits (completions archive their own messages, so
-- none waits for them unless its lease ran out and this read took the message).
create function pgflow.read_and_claim(
  flow_slug text,
  queue_name text,
  worker_id uuid,
  qty int,
  vt int,
  step_slug text default null
)
returns setof pgflow.claimed_task
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_route record;
  v_read bigint[];
  v_claimed pgflow.claimed_task[];
  v_unclaimed bigint[];
  v_next float8;
  v_qty int := qty;
  v_allowed int;
  v_retry float8;
begin
  -- GUARD: a wrong selector raises before any message is read (no messages: nothing claimed).
  v_route := pgflow._claim_route(flow_slug, queue_name, step_slug);
  if step_slug is not null and exists (
    select 1 from pgflow.step_limits as l
    where l.flow_slug = read_and_claim.flow_slug and l.step_slug = read_and_claim.step_slug
  ) then
    select c.allowed, c.retry_in_s into v_allowed, v_retry
    from pgflow._step_capacity(flow_slug, step_slug) as c;
    if v_allowed >= qty then
      v_retry := null;  -- room for all it asks for
    else
      v_qty := v_allowed;
      raise notice 'read_and_claim limited step "%" of flow "%" to % of % task(s).',
        step_slug, flow_slug, v_qty, qty
        using detail = jsonb_build_object('limited_step', step_slug, 'wanted', qty, 'allowed', v_qty)::text;
    end if;
  end if;
  v_read := '{}';
  -- Tasks of runs with a priority come first (engine 0031): the highest first, then the oldest.
  if v_qty > 0 and exists (
    select 1 from pgflow.runs as r
    where r.flow_slug = read_and_claim.flow_slug and r.priority > 0 and r.status = 'started'
  ) then
    v_read := pgflow._read_prioritised(v_route.queue, coalesce(v_route.lease, vt), v_qty);
  end if;
  if v_qty > cardinality(v_read) then
    select v_read || coalesce(array_agg(m.msg_id), '{}') into v_read
    from pgmq.read(v_route.queue, coalesce(v_route.lease, vt), v_qty - cardinality(v_read)) as m;
  end if;
  -- A worker that read less than it asked for sleeps until a message comes: an insert wakes it,
  -- but nothing tells it when a hidden one (a retry's delay, a start delay, a lease) shows again.
  -- So say when the first of them does, and it sleeps until then rather than a whole poll.
  if cardinality(v_read) < qty then
    execute format(
      'select extract(epoch from min(q.vt) - clock_timestamp())::float8 from pgmq.%I as q'
      ' where q.vt > clock_timestamp() and not (q.msg_id = any ($1))',
      pgflow.pgmq_table_name(v_route.queue))
    into v_next using v_read;
    if v_retry is not null then
      v_next := least(v_next, v_retry);  -- no room now: ask again then
    end if;
    if v_next is not null then
      raise notice 'read_and_claim: the next message of queue "%" is visible in % s.',
        v_route.queue, round(v_next::numeric, 3)
        using detail = jsonb_build_object('next_visible_in_s', v_next)::text;
    end if;
  end if;
  if cardinality(v_read) = 0 then
    return;
  end if;
  select coalesce(array_agg(c order by c.msg_id), '{}') into v_claimed
  from pgflow._claim_messages(flow_slug, v_route.queue, worker_id, step_slug, v_read,
    v_route.step_slugs, v_route.timeouts, v_route.lease, vt) as c;
  if cardinality(v_claimed) < cardinality(v_read) then
    v_unclaimed := array(
      select r.id from unnest(v_read) as r (id)
      except
      select c.msg_id from unnest(v_claimed) as c
      order by 1
    );
    raise notice 'read_and_claim left % message(s) of queue "%" unclaimed.',
      cardinality(v_unclaimed), v_route.queue
      using detail = jsonb_build_object('unclaimed_message_ids', to_jsonb(v_unclaimed))::text;
  end if;
  return query select * from unnest(v_claimed);
end;
$$;

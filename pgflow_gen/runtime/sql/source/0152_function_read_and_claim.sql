-- The claim in one call (engine 0012): reads up to qty messages of queue_name (hidden for vt
-- seconds, as pgmq.read does) and claims their tasks with claim_tasks, in one statement, so a
-- worker polls with one round trip and one commit instead of two. The selector follows
-- claim_tasks's rules and is checked before anything is read. Returns the claimed tasks; the
-- messages it read and did not claim (held, archived, foreign, or another claim's) are named in a
-- notice (JSON detail: unclaimed_message_ids), after claim_tasks's own notices; when it read
-- fewer than qty, another notice says when the queue's next hidden message shows again (JSON
-- detail: next_visible_in_s), so that the worker wakes then.
-- Locks as claim_tasks does (task rows before PGMQ rows; pgmq.read skips locked messages), but
-- holds the read's message locks until it commits: see the GUARD on archiving below.
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
set search_path = ''
as $$
declare
  v_read bigint[];
  v_claimed pgflow.claimed_task[];
  v_unclaimed bigint[];
  v_next float8;
begin
  -- GUARD: a wrong selector raises before any message is read (no messages: nothing claimed).
  perform from pgflow.claim_tasks(flow_slug, '{}', worker_id, queue_name, step_slug);
  -- GUARD: archive the completed tasks' messages before reading, while this transaction holds
  -- no message lock: an archive waits for the rows another reader holds, so the drain inside
  -- claim_tasks (after the read) must find as little as possible.
  perform pgflow.archive_completed_messages(lower(queue_name));
  select coalesce(array_agg(m.msg_id), '{}') into v_read
  from pgmq.read(lower(queue_name), vt, qty) as m;
  -- A worker that read less than it asked for sleeps until a message comes: an insert wakes it,
  -- but nothing tells it when a hidden one (a retry's delay, a start delay, a lease) shows again.
  -- So say when the first of them does, and it sleeps until then rather than a whole poll.
  if cardinality(v_read) < qty then
    execute format(
      'select extract(epoch from min(q.vt) - clock_timestamp())::float8 from pgmq.%I as q'
      ' where q.vt > clock_timestamp()', pgflow.pgmq_table_name(lower(queue_name)))
    into v_next;
    if v_next is not null then
      raise notice 'read_and_claim: the next message of queue "%" is visible in % s.',
        lower(queue_name), round(v_next::numeric, 3)
        using detail = jsonb_build_object('next_visible_in_s', v_next)::text;
    end if;
  end if;
  if cardinality(v_read) = 0 then
    return;
  end if;
  select coalesce(array_agg(c order by c.msg_id), '{}') into v_claimed
  from pgflow.claim_tasks(flow_slug, v_read, worker_id, queue_name, step_slug) as c;
  if cardinality(v_claimed) < cardinality(v_read) then
    v_unclaimed := array(
      select r.id from unnest(v_read) as r (id)
      except
      select c.msg_id from unnest(v_claimed) as c
      order by 1
    );
    raise notice 'read_and_claim left % message(s) of queue "%" unclaimed.',
      cardinality(v_unclaimed), lower(queue_name)
      using detail = jsonb_build_object('unclaimed_message_ids', to_jsonb(v_unclaimed))::text;
  end if;
  return query select * from unnest(v_claimed);
end;
$$;

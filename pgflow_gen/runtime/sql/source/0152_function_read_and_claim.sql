-- The claim in one call (engine 0012): reads up to qty messages of queue_name (hidden for vt
-- seconds, as pgmq.read does) and claims their tasks with claim_tasks, in one statement, so a
-- worker polls with one round trip and one commit instead of two. The selector follows
-- claim_tasks's rules and is checked before anything is read. Returns the claimed tasks; the
-- messages it read and did not claim (held, archived, foreign, or another claim's) are named in a
-- notice (JSON detail: unclaimed_message_ids), after claim_tasks's own notices.
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
begin
  -- GUARD: a wrong selector raises before any message is read (no messages: nothing claimed).
  perform from pgflow.claim_tasks(flow_slug, '{}', worker_id, queue_name, step_slug);
  -- GUARD: archive the completed tasks' messages before reading, while this transaction holds
  -- no message lock: an archive waits for the rows another reader holds, so the drain inside
  -- claim_tasks (after the read) must find as little as possible.
  perform pgflow.archive_completed_messages(lower(queue_name));
  select coalesce(array_agg(m.msg_id), '{}') into v_read
  from pgmq.read(lower(queue_name), vt, qty) as m;
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

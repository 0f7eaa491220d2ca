-- A busy worker's round trip (engine 0014): completes the tasks it has results for, as
-- complete_tasks does, then reads and claims up to qty tasks, as read_and_claim does, in one
-- transaction: one call and one commit for both. Tasks the completion started can be claimed at
-- once (their messages are visible to the read). Returns the claimed tasks; results the engine
-- ignored (a stale attempt, a task cancelled meanwhile) are named in a notice (JSON detail:
-- ignored_results, each with the result's position from 1, the task's current attempt and its
-- status), so the worker can say so as it does for complete_tasks's rows. A refused result
-- (complete_tasks raises) changes nothing and claims nothing. Locks as complete_tasks, then as
-- read_and_claim.
create function pgflow.complete_and_claim(
  flow_slug text,
  queue_name text,
  worker_id uuid,
  qty int,
  vt int,
  step_slug text,
  run_ids uuid[],
  step_slugs text[],
  task_indexes int[],
  outputs jsonb[],
  attempts int[]
)
returns setof pgflow.claimed_task
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_ignored jsonb;
begin
  select jsonb_agg(jsonb_build_array(t.ordinality, t.attempts_count, t.status) order by t.ordinality) into v_ignored
  from pgflow.complete_tasks(run_ids, step_slugs, task_indexes, outputs, attempts)
    with ordinality as t
  where t.status <> 'completed' or t.attempts_count <> attempts[t.ordinality];
  if v_ignored is not null then
    raise notice 'complete_and_claim ignored % result(s).', jsonb_array_length(v_ignored)
      using detail = jsonb_build_object('ignored_results', v_ignored)::text;
  end if;
  if qty > 0 then
    return query select * from pgflow.read_and_claim(flow_slug, queue_name, worker_id, qty, vt, step_slug);
  end if;
end;
$$;

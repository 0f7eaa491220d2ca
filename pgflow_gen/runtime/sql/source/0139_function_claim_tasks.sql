-- The claim, phase two of reading a task: of the messages a worker read from queue_name, claims the
-- queued tasks of this flow whose run and step are started, extends each message's visibility to
-- the step's timeout + 2 s, and returns the tasks with their inputs, the attempt each claim
-- started (the fencing token of the task's callbacks) and the step's effective timeout.
-- The selector follows the flow's queue mode (pgflow._claim_route): a step-queued flow claims only
-- tasks of step_slug, which must name a step exactly and queue_name its exact route; a flow-mode
-- flow takes no step. A wrong selector raises before anything changes. The claim itself, its
-- locks, held messages of paused steps, limited steps (engine 0017) and archived orphans are
-- pgflow._claim_messages's.
create function pgflow.claim_tasks(
  flow_slug text,
  msg_ids bigint[],
  worker_id uuid,
  queue_name text,
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
begin
  v_route := pgflow._claim_route(flow_slug, queue_name, step_slug);
  if msg_ids is null or cardinality(msg_ids) = 0 then
    return;
  end if;
  return query select * from pgflow._claim_messages(flow_slug, v_route.queue, worker_id, step_slug,
    msg_ids, v_route.step_slugs, v_route.timeouts, null, null);
end;
$$;

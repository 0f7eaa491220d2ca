-- The claim as engines before 0005 offered it (workers of those versions call it): claim_tasks
-- without the attempt and timeout columns. Same checks, same effects.
create function pgflow.start_tasks(
  flow_slug text,
  msg_ids bigint[],
  worker_id uuid,
  queue_name text,
  step_slug text default null
)
returns setof pgflow.step_task_record
language sql
volatile
set search_path = ''
as $$
  select c.flow_slug, c.run_id, c.step_slug, c.input, c.msg_id, c.task_index, c.flow_input
  from pgflow.claim_tasks(
    start_tasks.flow_slug, start_tasks.msg_ids, start_tasks.worker_id, start_tasks.queue_name,
    start_tasks.step_slug
  ) as c;
$$;

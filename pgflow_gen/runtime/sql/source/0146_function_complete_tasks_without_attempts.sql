-- The batch without attempts, as engines before 0005 offered it (their workers call it): answers
-- whichever attempts are current.
create function pgflow.complete_tasks(run_ids uuid[], step_slugs text[], task_indexes int[], outputs jsonb[])
returns setof pgflow.step_tasks
language sql
volatile
set search_path = ''
as $$
  select * from pgflow.complete_tasks($1, $2, $3, $4, null);
$$;

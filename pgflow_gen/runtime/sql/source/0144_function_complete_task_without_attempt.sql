-- The callback without an attempt, as engines before 0005 offered it (their workers call it):
-- answers whichever attempt is current.
create function pgflow.complete_task(run_id uuid, step_slug text, task_index int, output jsonb)
returns setof pgflow.step_tasks
language sql
volatile
set search_path = ''
as $$
  select * from pgflow.complete_task($1, $2, $3, $4, null);
$$;

-- The callback without an attempt, as engines before 0005 offered it (their workers call it):
-- answers whichever attempt is current, so a resent failure can fail a later attempt.
create function pgflow.fail_task(run_id uuid, step_slug text, task_index int, error_message text)
returns setof pgflow.step_tasks
language sql
volatile
set search_path = ''
as $$
  select * from pgflow.fail_task($1, $2, $3, $4, null);
$$;

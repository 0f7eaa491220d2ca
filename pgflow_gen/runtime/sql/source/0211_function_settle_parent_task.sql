-- Tells a subflow run's parent task how its child ended (engine 0028), in the transaction that
-- ended it. Completed: the task completes with the child's run output (the last task of a map
-- completes the step with the outputs in task order), as complete_task would; failed: the task's
-- attempt fails (pgflow._fail_attempt: retried in place while attempts are left); cancelled: the
-- attempt fails for good. Nothing happens for a top run, or when the parent run, its step or the
-- task is no longer started (the parent failed or was cancelled first, and ended its children).
-- Locks the parent's run, step state and task (in that order) after the child's: a cancel of the
-- parent takes them the other way round, so the two can deadlock; PostgreSQL then aborts one
-- (SQLSTATE 40P01), which its caller sends again.
create function pgflow._settle_parent_task(child_run_id uuid)
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_child pgflow.runs;
  v_parent record;
  v_failure text;
begin
  select * into v_child from pgflow.runs as r where r.run_id = _settle_parent_task.child_run_id;
  if v_child.parent_run_id is null or v_child.status = 'started' then
    return;
  end if;
  select r.status as run_status, ss.status as step_status, ss.remaining_tasks, s.step_type, t.status as task_status
  into v_parent
  from pgflow.runs as r
  join pgflow.step_states as ss on ss.run_id = r.run_id and ss.step_slug = v_child.parent_step_slug
  join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
  join pgflow.step_tasks as t
    on t.run_id = r.run_id and t.step_slug = ss.step_slug and t.task_index = v_child.parent_task_index
  where r.run_id = v_child.parent_run_id
  for update of r, ss, t;
  -- GUARD: the parent moved on without this child (failed, cancelled, or skipped the step).
  if not found or v_parent.run_status <> 'started' or v_parent.step_status <> 'started'
    or v_parent.task_status <> 'started' then
    return;
  end if;

  if v_child.status = 'completed' then
    update pgflow.step_tasks as t
    set status = 'completed', output = v_child.output, completed_at = clock_timestamp()
    where t.run_id = v_child.parent_run_id and t.step_slug = v_child.parent_step_slug
      and t.task_index = v_child.parent_task_index;
    if v_parent.remaining_tasks > 1 then
      update pgflow.step_states as ss set remaining_tasks = ss.remaining_tasks - 1
      where ss.run_id = v_child.parent_run_id and ss.step_slug = v_child.parent_step_slug;
    elsif pgflow._complete_step(v_child.parent_run_id, v_child.parent_step_slug,
        case when v_parent.step_type = 'map' then (
          select jsonb_agg(t.output order by t.task_index)
          from pgflow.step_tasks as t
          where t.run_id = v_child.parent_run_id and t.step_slug = v_child.parent_step_slug
        ) else v_child.output end) then
      perform pgflow._advance_run(v_child.parent_run_id);
    end if;
    return;
  end if;

  -- The child's first failed step says why (its error's first line).
  select format('step "%s": %s', ss.step_slug, split_part(ss.error_message, E'\n', 1)) into v_failure
  from pgflow.step_states as ss
  join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
  where ss.run_id = v_child.run_id and ss.status = 'failed'
  order by ss.failed_at, s.step_index
  limit 1;
  if v_child.status = 'failed' then
    perform pgflow._fail_attempt(v_child.parent_run_id, v_child.parent_step_slug, v_child.parent_task_index,
      format('Subflow run %s of flow "%s" failed%s', v_child.run_id, v_child.flow_slug,
        coalesce(': ' || v_failure, '.')));
  else
    perform pgflow._fail_attempt(v_child.parent_run_id, v_child.parent_step_slug, v_child.parent_task_index,
      format('Subflow run %s of flow "%s" was cancelled%s', v_child.run_id, v_child.flow_slug,
        coalesce(': ' || v_child.cancel_reason, '.')),
      'its subflow run was cancelled');
  end if;
end;
$$;

-- A worker reports a task's failure: its current attempt fails (pgflow._fail_attempt: queued
-- again after base_delay * 2^attempts with attempts left in its budget; exhausted, when_exhausted
-- decides: fail the run, skip the step, or skip it and everything downstream). A failure with a
-- `permanent_reason` (engine 0011) is not retried, whatever attempts are left.
-- Locks run, step state and task (in that order, in one statement), then PGMQ rows.
-- Late callbacks change nothing, and so does a stale one (`attempt`, from claim_tasks, is not the
-- task's current attempt; attempt numbers never repeat, engine 0020): the task's row comes back
-- unchanged, a stale one's attempts_count differing from `attempt`.
create function pgflow.fail_task(
  run_id uuid, step_slug text, task_index int, error_message text, attempt int,
  permanent_reason text default null
)
returns setof pgflow.step_tasks
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_locked record;
  v_task pgflow.step_tasks;
begin
  perform pgflow._require_task_routes(array[run_id], array[step_slug]);
  select r.status as run_status, ss.status as step_status, t as task, s.subflow_slug into v_locked
  from pgflow.runs as r
  join pgflow.step_states as ss on ss.run_id = r.run_id and ss.step_slug = fail_task.step_slug
  join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
  join pgflow.step_tasks as t
    on t.run_id = r.run_id and t.step_slug = ss.step_slug and t.task_index = fail_task.task_index
  where r.run_id = fail_task.run_id
  for update of r, ss, t;
  if not found then
    if not exists (select 1 from pgflow.runs as r where r.run_id = fail_task.run_id) then
      raise exception 'Run % does not exist.', run_id using errcode = 'P0002';
    end if;
    raise exception 'Task % of step "%" in run % does not exist.', task_index, step_slug, run_id
      using errcode = 'P0002';
  end if;
  v_task := v_locked.task;

  -- GUARD: a subflow step's task (engine 0028) ends with its child run, never by a report.
  if v_locked.subflow_slug is not null then
    raise exception 'Task % of step "%" in run % runs a subflow: it ends when its child run does.',
      task_index, step_slug, run_id
      using errcode = '55000', hint = 'Nothing was changed. Complete, fail or cancel the child run instead.';
  end if;

  -- GUARD: a callback of an earlier attempt is stale and changes nothing: since that attempt,
  -- the task failed and was retried, or stall recovery requeued it, and another claim started
  -- the attempt that is current now. A null attempt answers whichever attempt is current.
  if attempt is not null and v_task.attempts_count <> attempt then
    return next v_task;
    return;
  end if;

  -- GUARD: late callbacks are no-ops (cancellation and skips win).
  if v_locked.run_status <> 'started' or v_task.status <> 'started' or v_locked.step_status <> 'started' then
    return next v_task;
    return;
  end if;

  return next pgflow._fail_attempt(run_id, step_slug, task_index, error_message, permanent_reason);
end;
$$;

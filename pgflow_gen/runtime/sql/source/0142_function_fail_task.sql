-- A worker reports a task's failure. With attempts left the task is queued again and its message
-- hidden for base_delay * 2^attempts seconds; exhausted, when_exhausted decides: fail the run,
-- skip the step, or skip it and everything downstream. Locks run, step state, task, PGMQ.
create function pgflow.fail_task(run_id uuid, step_slug text, task_index int, error_message text)
returns setof pgflow.step_tasks
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_run_status text;
  v_task pgflow.step_tasks;
  v_step record;
begin
  select r.status into v_run_status from pgflow.runs as r where r.run_id = fail_task.run_id for update;
  if not found then
    raise exception 'Run % does not exist.', run_id using errcode = 'P0002';
  end if;
  select ss.status, s.when_exhausted,
    coalesce(s.opt_max_attempts, f.opt_max_attempts) as max_attempts,
    coalesce(s.opt_base_delay, f.opt_base_delay) as base_delay
  into v_step
  from pgflow.step_states as ss
  join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
  join pgflow.flows as f on f.flow_slug = ss.flow_slug
  where ss.run_id = fail_task.run_id and ss.step_slug = fail_task.step_slug
  for update of ss;
  select * into v_task from pgflow.step_tasks as t
  where t.run_id = fail_task.run_id and t.step_slug = fail_task.step_slug and t.task_index = fail_task.task_index
  for update of t;
  if not found then
    raise exception 'Task % of step "%" in run % does not exist.', task_index, step_slug, run_id
      using errcode = 'P0002';
  end if;

  -- GUARD: late callbacks are no-ops (cancellation and skips win).
  if v_run_status <> 'started' or v_task.status <> 'started' or v_step.status <> 'started' then
    return next v_task;
    return;
  end if;

  if v_task.attempts_count < v_step.max_attempts then
    update pgflow.step_tasks as t
    set status = 'queued', started_at = null, error_message = fail_task.error_message
    where t.run_id = fail_task.run_id and t.step_slug = fail_task.step_slug and t.task_index = fail_task.task_index
    returning * into v_task;
    perform pgflow.set_vt_batch(v_task.queue_name, array[v_task.message_id],
      array[pgflow.calculate_retry_delay(v_step.base_delay, v_task.attempts_count)]);
    return next v_task;
    return;
  end if;

  update pgflow.step_tasks as t
  set status = 'failed', failed_at = clock_timestamp(), error_message = fail_task.error_message
  where t.run_id = fail_task.run_id and t.step_slug = fail_task.step_slug and t.task_index = fail_task.task_index
  returning * into v_task;
  perform pgflow._archive_messages(v_task.queue_name, array[v_task.message_id]);

  if v_step.when_exhausted = 'fail' then
    update pgflow.step_states as ss
    set status = 'failed', failed_at = clock_timestamp(), remaining_tasks = null,
      error_message = fail_task.error_message
    where ss.run_id = fail_task.run_id and ss.step_slug = fail_task.step_slug;
    perform pgflow._emit_event(run_id, 'step:failed', step_slug, 'failed');
    perform pgflow._fail_run(run_id);
  else
    if v_step.when_exhausted = 'skip' then
      perform pgflow._skip_step(run_id, step_slug, 'handler_failed', error_message);
    else
      perform pgflow._skip_step_cascade(run_id, step_slug, 'handler_failed', error_message);
    end if;
    if pgflow._advance_run(run_id) then
      perform pgflow._maybe_complete_run(run_id);
    end if;
  end if;

  return next v_task;
end;
$$;

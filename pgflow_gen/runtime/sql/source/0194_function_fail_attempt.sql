-- Fails the current attempt of a started task (engine 0020: shared by fail_task and stall
-- recovery). With attempts left in its budget (attempts_count - attempts_before_retry below the
-- step's max_attempts) the task is queued again and its message hidden for base_delay * 2^attempts
-- of this budget; exhausted, when_exhausted decides: fail the run, skip the step, or skip it and
-- everything downstream. No retry either for a permanent failure (a `permanent_reason`: the stored
-- error gets a second line that says so and why) or for a task whose message is gone (nothing
-- could deliver the retry). A subflow step's task (engine 0028) retries its child run in place
-- (pgflow._retry_run: its completed steps keep their outputs; its failed tasks' messages hidden
-- for the delay) as its next attempt; it is not retried when its child is not a failed run (it
-- was cancelled, or never started). The caller holds the run, step state and task row locks (in that
-- order) and has checked that all three are started; PGMQ rows are touched last.
create function pgflow._fail_attempt(
  run_id uuid, step_slug text, task_index int, error_message text, permanent_reason text default null
)
returns pgflow.step_tasks
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_step record;
  v_task pgflow.step_tasks;
  v_attempt int;
  v_delayed int;
  v_note text;
  v_child record;
begin
  select * into v_task from pgflow.step_tasks as t
  where t.run_id = _fail_attempt.run_id and t.step_slug = _fail_attempt.step_slug
    and t.task_index = _fail_attempt.task_index;
  select s.when_exhausted, s.subflow_slug,
    coalesce(s.opt_max_attempts, f.opt_max_attempts) as max_attempts,
    coalesce(s.opt_base_delay, f.opt_base_delay) as base_delay
  into v_step
  from pgflow.steps as s
  join pgflow.flows as f on f.flow_slug = s.flow_slug
  where s.flow_slug = v_task.flow_slug and s.step_slug = v_task.step_slug;
  -- The attempt within the task's budget (the budget starts again with each retry_run).
  v_attempt := v_task.attempts_count - v_task.attempts_before_retry;

  if v_attempt < v_step.max_attempts and v_step.subflow_slug is not null and permanent_reason is null then
    select c.run_id, c.status into v_child from pgflow.runs as c
    where c.parent_run_id = _fail_attempt.run_id and c.parent_step_slug = _fail_attempt.step_slug
      and c.parent_task_index = _fail_attempt.task_index
    order by c.started_at desc, c.run_id
    limit 1;
    if v_child.status is not distinct from 'failed' then
      -- The next attempt starts before the child resumes: the child may finish at once, and
      -- then completes this attempt.
      update pgflow.step_tasks as t
      set attempts_count = t.attempts_count + 1, started_at = clock_timestamp(),
        error_message = _fail_attempt.error_message
      where t.run_id = _fail_attempt.run_id and t.step_slug = _fail_attempt.step_slug
        and t.task_index = _fail_attempt.task_index;
      if pgflow._retry_run(v_child.run_id, pgflow.calculate_retry_delay(v_step.base_delay, v_attempt)) is null then
        select * into v_task from pgflow.step_tasks as t
        where t.run_id = _fail_attempt.run_id and t.step_slug = _fail_attempt.step_slug
          and t.task_index = _fail_attempt.task_index;
        return v_task;
      end if;
      -- The child's flow gained a step since it started: it cannot resume, and the attempt
      -- fails as the last one would.
    end if;
  elsif v_attempt < v_step.max_attempts and v_task.permanently_stalled_at is null
    and permanent_reason is null then
    select count(*) into v_delayed from pgflow._set_vt_batch(v_task.queue_name, array[v_task.message_id],
      array[pgflow.calculate_retry_delay(v_step.base_delay, v_attempt)]);
    if v_delayed = 1 then
      update pgflow.step_tasks as t
      set status = 'queued', started_at = null, error_message = _fail_attempt.error_message
      where t.run_id = _fail_attempt.run_id and t.step_slug = _fail_attempt.step_slug
        and t.task_index = _fail_attempt.task_index
      returning * into v_task;
      return v_task;
    end if;
  end if;

  if permanent_reason is not null then
    -- After the error's first line (its summary), before the traceback.
    v_note := format('Not retried (attempt %s of %s): %s', v_attempt, v_step.max_attempts, permanent_reason);
    error_message := case when strpos(error_message, E'\n') > 0
      then left(error_message, strpos(error_message, E'\n') - 1) || E'\n' || v_note
        || substr(error_message, strpos(error_message, E'\n'))
      else coalesce(error_message || E'\n', '') || v_note end;
  end if;
  update pgflow.step_tasks as t
  set status = 'failed', failed_at = clock_timestamp(), error_message = _fail_attempt.error_message
  where t.run_id = _fail_attempt.run_id and t.step_slug = _fail_attempt.step_slug
    and t.task_index = _fail_attempt.task_index
  returning * into v_task;

  if v_step.when_exhausted = 'fail' then
    update pgflow.step_states as ss
    set status = 'failed', failed_at = clock_timestamp(), remaining_tasks = null,
      error_message = _fail_attempt.error_message
    where ss.run_id = _fail_attempt.run_id and ss.step_slug = _fail_attempt.step_slug;
    perform pgflow._emit_event(run_id, 'step:failed', step_slug, 'failed');
    perform pgflow._fail_run(run_id);
  else
    if v_step.when_exhausted = 'skip' then
      perform pgflow._skip_step(run_id, step_slug, 'handler_failed', error_message);
    else
      perform pgflow._skip_step_cascade(run_id, step_slug, 'handler_failed', error_message);
    end if;
    perform pgflow._advance_run(run_id);
  end if;

  -- Last: PGMQ rows are only touched after every task row this call needs is locked.
  if v_task.message_id is not null then
    perform pgmq.archive(v_task.queue_name, v_task.message_id);
  end if;
  return v_task;
end;
$$;

-- A worker reports a task's output. The last task of a step completes the step (a map's output
-- is its task outputs in task order), which readies children and may complete the run.
-- Late callbacks (run finished, step closed, task not started) change nothing, and so does a
-- stale one: `attempt` (from claim_tasks) is not the task's current attempt. Either returns the
-- task's row unchanged; a stale one's attempts_count differs from `attempt`.
-- Locks run, step state and task (in that order, in one statement), then the task's message,
-- which it deletes (engine 0025; archived from 0014, by the next claim before): the task row
-- records the completion, and the dashboard counts completions from the tasks table. A result
-- that fails the task (a map's dependency that is not an array) archives the message.
create function pgflow.complete_task(run_id uuid, step_slug text, task_index int, output jsonb, attempt int)
returns setof pgflow.step_tasks
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_locked record;
  v_task pgflow.step_tasks;
  v_output_type text := coalesce(jsonb_typeof(output), 'SQL NULL');
begin
  perform pgflow._require_task_routes(array[run_id], array[step_slug]);
  select r.status as run_status, ss.status as step_status, ss.remaining_tasks, s.step_type, s.subflow_slug,
    t as task,
    -- The first map step fed by this single step, if any (its output must then be an array).
    (select c.step_slug from pgflow.deps as d
     join pgflow.steps as c on c.flow_slug = d.flow_slug and c.step_slug = d.step_slug
     where s.step_type = 'single' and d.flow_slug = s.flow_slug and d.dep_slug = s.step_slug
       and c.step_type = 'map'
     order by c.step_index limit 1) as map_child
  into v_locked
  from pgflow.runs as r
  join pgflow.step_states as ss on ss.run_id = r.run_id and ss.step_slug = complete_task.step_slug
  join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
  join pgflow.step_tasks as t
    on t.run_id = r.run_id and t.step_slug = ss.step_slug and t.task_index = complete_task.task_index
  where r.run_id = complete_task.run_id
  for update of r, ss, t;
  if not found then
    if not exists (select 1 from pgflow.runs as r where r.run_id = complete_task.run_id) then
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

  -- GUARD: late callbacks are no-ops.
  if v_locked.run_status <> 'started' or v_locked.step_status <> 'started' or v_task.status <> 'started' then
    return next v_task;
    return;
  end if;

  -- GUARD: a single step that feeds a map must produce an array; anything else fails the run.
  if v_locked.map_child is not null and v_output_type <> 'array' then
    update pgflow.step_tasks as t
    set status = 'failed', output = complete_task.output, failed_at = clock_timestamp(),
      error_message = format('[TYPE_VIOLATION] Produced %s instead of array', v_output_type)
    where t.run_id = complete_task.run_id and t.step_slug = complete_task.step_slug
      and t.task_index = complete_task.task_index
    returning * into v_task;
    update pgflow.step_states as ss
    set status = 'failed', failed_at = clock_timestamp(), remaining_tasks = null,
      error_message = format('[TYPE_VIOLATION] Map step %s expects array input but dependency %s produced %s',
        v_locked.map_child, complete_task.step_slug, v_output_type)
    where ss.run_id = complete_task.run_id and ss.step_slug = complete_task.step_slug;
    perform pgflow._emit_event(run_id, 'step:failed', step_slug, 'failed');
    perform pgflow._fail_run(run_id);
    perform pgmq.archive(v_task.queue_name, v_task.message_id);
    return next v_task;
    return;
  end if;

  update pgflow.step_tasks as t
  set status = 'completed', output = complete_task.output, completed_at = clock_timestamp()
  where t.run_id = complete_task.run_id and t.step_slug = complete_task.step_slug
    and t.task_index = complete_task.task_index
  returning * into v_task;

  if v_locked.remaining_tasks > 1 then
    update pgflow.step_states as ss set remaining_tasks = ss.remaining_tasks - 1
    where ss.run_id = complete_task.run_id and ss.step_slug = complete_task.step_slug;
  elsif pgflow._complete_step(run_id, step_slug,
      case when v_locked.step_type = 'map' then (
        select jsonb_agg(t.output order by t.task_index)
        from pgflow.step_tasks as t
        where t.run_id = complete_task.run_id and t.step_slug = complete_task.step_slug
      ) else output end) then
    perform pgflow._advance_run(run_id);
  end if;
  -- The place a keyed task freed goes to its key's next parked task now (engine 0018).
  if current_setting('pgflow.concurrency_passes', true) = 'pending' then
    perform pgflow._pass_concurrency_places();
  end if;

  -- The task row records the completion: its message is deleted, not archived (engine 0025).
  perform pgmq.delete(v_task.queue_name, v_task.message_id);
  return next v_task;
end;
$$;

-- Creates a started step's tasks: one message per task index in the step's queue, carrying only
-- the task key, then the task rows that remember each message id (paired through RETURNING, never
-- by row order). The queue table name is dynamic, so its statement is planned on every call and
-- kept as simple as possible (a single-task step, the common case, inserts one row). A message
-- of a run with a priority carries it (engine 0031, pgflow._priority_key).
create function pgflow._enqueue_step_tasks(
  run_id uuid,
  flow_slug text,
  step_slug text,
  queue_name text,
  task_count int,
  delay_seconds int
)
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_queue_table text := pgflow.pgmq_table_name(queue_name);
  v_message_id bigint;
  v_message_ids bigint[];
  v_task_indexes int[];
  v_priority jsonb;
begin
  select pgflow._priority_key(r.priority) into v_priority
  from pgflow.runs as r where r.run_id = _enqueue_step_tasks.run_id;
  if task_count = 1 then
    execute format('insert into pgmq.%I (vt, message) values ($1, $2) returning msg_id', v_queue_table)
    into v_message_id
    using clock_timestamp() + make_interval(secs => delay_seconds),
      jsonb_build_object('flow_slug', flow_slug, 'run_id', run_id, 'step_slug', step_slug, 'task_index', 0)
        || v_priority;
    insert into pgflow.step_tasks (run_id, flow_slug, step_slug, task_index, message_id, queue_name)
    values (run_id, flow_slug, step_slug, 0, v_message_id, queue_name);
    return;
  end if;

  execute format(
    $q$
      with sent as (
        insert into pgmq.%I (vt, message)
        select $1, jsonb_build_object('flow_slug', $2, 'run_id', $3, 'step_slug', $4, 'task_index', i)
          || $6
        from generate_series(0, $5 - 1) as i
        returning msg_id, (message ->> 'task_index')::int as task_index
      )
      select array_agg(msg_id), array_agg(task_index) from sent
    $q$,
    v_queue_table
  )
  into v_message_ids, v_task_indexes
  using clock_timestamp() + make_interval(secs => delay_seconds), flow_slug, run_id, step_slug, task_count,
    v_priority;
  insert into pgflow.step_tasks (run_id, flow_slug, step_slug, task_index, message_id, queue_name)
  select _enqueue_step_tasks.run_id, _enqueue_step_tasks.flow_slug, _enqueue_step_tasks.step_slug,
    m.task_index, m.message_id, _enqueue_step_tasks.queue_name
  from unnest(v_task_indexes, v_message_ids) as m (task_index, message_id);
end;
$$;

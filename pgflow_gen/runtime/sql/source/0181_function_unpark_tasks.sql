-- Gives up to qty of a key's oldest parked tasks their messages (engine 0018): locks their parked
-- rows and tasks, passing over those another transaction holds (a task being cancelled), deletes
-- the parked rows and sends one message per task, in order, each visible at its not_before at the
-- earliest (its step's start delay), recorded on the task. A parked row and its task change
-- together (one transaction gives the task its message and deletes the row), so a task found
-- through a live parked row has no message yet: its row is never locked only to be found
-- admitted meanwhile (it would stay locked until this commits, and a claim of its message would
-- pass it over). Returns how many it sent; null qty: all. Called by
-- pgflow._pass_concurrency_places and pgflow._balance_concurrency_keys.
create function pgflow._unpark_tasks(flow_slug text, step_slug text, concurrency_key text, qty int)
returns int
language plpgsql
volatile
set search_path = ''
set enable_seqscan = off
as $$
declare
  v_seqs bigint[];
  v_runs uuid[];
  v_indexes int[];
  v_queues text[];
  v_not_befores timestamptz[];
  v_priorities int[];
  v_queue text;
  v_table text;
  v_message_id bigint;
  v_sent int := 0;
begin
  select array_agg(k.parked_seq order by k.parked_seq), array_agg(k.run_id order by k.parked_seq),
    array_agg(k.task_index order by k.parked_seq), array_agg(k.queue_name order by k.parked_seq),
    array_agg(k.not_before order by k.parked_seq), array_agg(k.priority order by k.parked_seq)
  into v_seqs, v_runs, v_indexes, v_queues, v_not_befores, v_priorities
  from (
    select p.parked_seq, t.run_id, t.task_index, t.queue_name, p.not_before, r.priority
    from pgflow.parked_tasks as p
    join pgflow.step_tasks as t
      on t.run_id = p.run_id and t.step_slug = p.step_slug and t.task_index = p.task_index
    join pgflow.runs as r on r.run_id = t.run_id
    where p.flow_slug = _unpark_tasks.flow_slug and p.step_slug = _unpark_tasks.step_slug
      and p.concurrency_key = _unpark_tasks.concurrency_key
      and t.status = 'queued' and t.message_id is null
    order by p.parked_seq
    limit qty
    for update of p, t skip locked
  ) as k;
  if v_seqs is null then
    return 0;
  end if;
  delete from pgflow.parked_tasks as p
  where p.flow_slug = _unpark_tasks.flow_slug and p.step_slug = _unpark_tasks.step_slug
    and p.concurrency_key = _unpark_tasks.concurrency_key and p.parked_seq = any (v_seqs);
  -- One message at a time: a plain insert costs less to plan than one statement for all, and
  -- most calls give one task its message.
  for i in 1 .. cardinality(v_seqs) loop
    if v_queue is distinct from v_queues[i] then
      v_queue := v_queues[i];
      v_table := pgflow.pgmq_table_name(v_queue);
    end if;
    execute format('insert into pgmq.%I (vt, message) values ($1, $2) returning msg_id', v_table)
    into v_message_id
    using greatest(clock_timestamp(), v_not_befores[i]),
      jsonb_build_object('flow_slug', flow_slug, 'run_id', v_runs[i], 'step_slug', step_slug,
        'task_index', v_indexes[i]) || pgflow._priority_key(v_priorities[i]);
    update pgflow.step_tasks as t set message_id = v_message_id
    where t.run_id = v_runs[i] and t.step_slug = _unpark_tasks.step_slug and t.task_index = v_indexes[i];
    v_sent := v_sent + 1;
  end loop;
  return v_sent;
end;
$$;

-- Gives parked tasks of one key their messages (engine 0018): deletes their parked rows (by
-- parked_seqs) and sends one message per task, in the order given, each visible at
-- not_befores[i] at the earliest (its step's start delay), recorded on the task. Returns how
-- many it sent. The callers have locked the parked rows and the tasks. Called by
-- pgflow._pass_concurrency_places and pgflow._balance_concurrency_keys.
create function pgflow._unpark_tasks(
  flow_slug text,
  step_slug text,
  concurrency_key text,
  parked_seqs bigint[],
  run_ids uuid[],
  task_indexes int[],
  queue_names text[],
  not_befores timestamptz[]
)
returns int
language plpgsql
volatile
set search_path = ''
set enable_seqscan = off
as $$
declare
  v_queue text;
  v_count int;
  v_sent int := 0;
begin
  delete from pgflow.parked_tasks as p
  where p.flow_slug = _unpark_tasks.flow_slug and p.step_slug = _unpark_tasks.step_slug
    and p.concurrency_key = _unpark_tasks.concurrency_key and p.parked_seq = any (parked_seqs);
  -- One queue in all but rare cases (tasks keep the queue their step had when they were created).
  for v_queue in select distinct q.name from unnest(queue_names) as q (name) order by 1 loop
    execute format(
      $q$
        with sent as (
          insert into pgmq.%I (vt, message)
          select greatest(clock_timestamp(), x.not_before),
            jsonb_build_object('flow_slug', $1, 'run_id', x.run_id, 'step_slug', $2, 'task_index', x.task_index)
          from unnest($3::uuid[], $4::int[], $5::timestamptz[], $6::text[]) with ordinality
            as x (run_id, task_index, not_before, queue_name, n)
          where x.queue_name = $7
          order by x.n
          returning msg_id, message
        )
        update pgflow.step_tasks as t set message_id = s.msg_id
        from sent as s
        where t.run_id = (s.message ->> 'run_id')::uuid and t.step_slug = $2
          and t.task_index = (s.message ->> 'task_index')::int
      $q$,
      pgflow.pgmq_table_name(v_queue)
    )
    using flow_slug, step_slug, run_ids, task_indexes, not_befores, queue_names, v_queue;
    get diagnostics v_count = row_count;
    v_sent := v_sent + v_count;
  end loop;
  return v_sent;
end;
$$;

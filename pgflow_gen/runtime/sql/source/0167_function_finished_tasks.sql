-- How many tasks left each queue the engine's flows own since `since` ago, per minute, and per
-- step unless by_step is false (engine 0016). One row per queue, step and minute.
-- A completed task's message is deleted (engine 0025): the task row records it, and the tasks
-- table's BRIN index on completed_at finds the last hour's without reading the history (a BRIN
-- index keeps a task's updates HOT on PostgreSQL 16 and later). The message of a task that fails
-- for good, is skipped or is cancelled is archived, and the archive tables' archived_at index
-- counts those (a message archived for a completed task, before engine 0025, is left out, so no
-- task counts twice). For the dashboard and metrics; reads only, takes no locks. A queue without
-- an archive table (dropped meanwhile) counts its completed tasks only. About 2 ms at 1,000,000
-- finished runs (benchmarks/maintenance.py).
create function pgflow.finished_tasks(since interval default '1 hour', by_step boolean default true)
returns table (queue_name text, step_slug text, minute timestamptz, tasks bigint)
language plpgsql
stable
security definer
set search_path = ''
-- Its few rows are not worth parallel workers (starting them cost 6 ms of a 1 ms query).
set max_parallel_workers_per_gather = 0
as $$
declare
  v_queue record;
  v_parts text[] := array[
    'select t.queue_name, case when $2 then t.step_slug end as step_slug,'
    ' date_trunc(''minute'', t.completed_at) as minute, count(*) as tasks'
    ' from pgflow.step_tasks as t where t.completed_at > now() - $1 and t.status = ''completed'''
    ' group by 1, 2, 3'];
begin
  for v_queue in
    select q.queue_name, min(q.step_slug) as only_step, count(distinct q.step_slug) = 1 as one_step
    from (
      select s.queue_name, s.step_slug from pgflow.steps as s where s.step_type <> 'signal'
        and s.subflow_slug is null
      union
      select pgflow.default_queue_name(f.flow_slug), null from pgflow.flows as f
      where f.queue_mode = 'flow'
    ) as q
    group by q.queue_name
    order by q.queue_name
  loop
    continue when to_regclass(format('pgmq.%I', pgflow.pgmq_table_name(v_queue.queue_name, 'a'))) is null;
    v_parts := v_parts || format(
      'select %1$L::text, case when $2 then %2$s end, date_trunc(''minute'', a.archived_at), count(*)'
      ' from pgmq.%3$I as a where a.archived_at > now() - $1'
      ' and not exists (select 1 from pgflow.step_tasks as t'
      '   where t.message_id = a.msg_id and t.queue_name = %1$L and t.status = ''completed'')'
      ' group by 1, 2, 3',
      v_queue.queue_name,
      case when v_queue.one_step then quote_nullable(v_queue.only_step) || '::text'
        else 'a.message ->> ''step_slug''' end,
      pgflow.pgmq_table_name(v_queue.queue_name, 'a'));
  end loop;
  return query execute
    'select f.queue_name, f.step_slug, f.minute, sum(f.tasks)::bigint from ('
    || array_to_string(v_parts, ' union all ')
    || ') as f group by 1, 2, 3'
    using since, by_step;
end;
$$;

-- How many tasks left each queue the engine's flows own since `since` ago, per minute, and per
-- step unless by_step is false (engine 0016): a task's message is archived when the task
-- completes, fails for good, is skipped or cancelled, so the archive tables' archived_at index
-- answers without reading the tasks table (whose few indexes keep a task's updates cheap).
-- Where one step uses the queue (step mode), or by_step is false, the index alone counts; a
-- flow-mode queue's steps are read from the messages. For the dashboard and metrics; reads only,
-- takes no locks. A queue without an archive table (dropped meanwhile) is left out.
create function pgflow.finished_tasks(since interval default '1 hour', by_step boolean default true)
returns table (queue_name text, step_slug text, minute timestamptz, tasks bigint)
language plpgsql
stable
security definer
set search_path = ''
as $$
declare
  v_queue record;
begin
  for v_queue in
    select q.queue_name, min(q.step_slug) as only_step, count(distinct q.step_slug) = 1 as one_step
    from (
      select s.queue_name, s.step_slug from pgflow.steps as s where s.step_type <> 'signal'
      union
      select pgflow.default_queue_name(f.flow_slug), null from pgflow.flows as f
      where f.queue_mode = 'flow'
    ) as q
    group by q.queue_name
    order by q.queue_name
  loop
    continue when to_regclass(format('pgmq.%I', pgflow.pgmq_table_name(v_queue.queue_name, 'a'))) is null;
    if v_queue.one_step or not by_step then
      return query execute format(
        'select $1, $2, date_trunc(''minute'', a.archived_at), count(*)'
        ' from pgmq.%I as a where a.archived_at > now() - $3 group by 3',
        pgflow.pgmq_table_name(v_queue.queue_name, 'a'))
        using v_queue.queue_name, case when by_step then v_queue.only_step end, since;
    else
      return query execute format(
        'select $1, a.message ->> ''step_slug'', date_trunc(''minute'', a.archived_at), count(*)'
        ' from pgmq.%I as a where a.archived_at > now() - $2 group by 2, 3',
        pgflow.pgmq_table_name(v_queue.queue_name, 'a'))
        using v_queue.queue_name, since;
    end if;
  end loop;
end;
$$;

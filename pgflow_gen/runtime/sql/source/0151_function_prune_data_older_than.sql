-- Maintenance: deletes finished runs (completed, failed or cancelled before now - retention), each
-- with its subflow runs however deep (engine 0028; "subflow_runs" counts them), with their step
-- states, tasks, operators' actions and the tasks' messages still in a queue; and, older than
-- retention, operators' actions on steps, workers silent that long, and archived messages in
-- every queue a flow owns (its steps' routes, plus the default queue of a flow-mode flow), found
-- by their canonical archive table names without listing queues, and the starts table triggers
-- skipped (engine 0032). Running runs are
-- never touched, whatever their age. With batch_size (engine 0015) one call deletes at most that
-- many runs, and at most that many archived messages per queue, so that a large backlog goes in
-- short transactions (a long one holds back vacuum for every table, the queues' included): the
-- result's "done" is false while something may be left, and the caller calls again.
-- Locks the runs it deletes (skipping locked ones: a run busy right now is pruned next time).
create function pgflow.prune_data_older_than(retention interval, batch_size int default null)
returns jsonb
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_cutoff timestamptz := now() - retention;
  v_runs uuid[];
  v_queue text;
  v_workers int;
  v_archived int := 0;
  v_count int;
  v_queues text[];
  v_messages bigint[];
  v_done boolean := true;
  v_top_runs int;
begin
  if retention is null or retention < interval '0' then
    raise exception 'Retention must be a non-negative interval, got %.', retention using errcode = '22023';
  end if;
  if batch_size < 1 then
    raise exception 'The batch size must be at least 1, got %.', batch_size
      using errcode = '22023', hint = 'Pass null to prune everything in one call.';
  end if;

  perform pgflow.archive_completed_messages();

  -- Same lock order as the task callbacks: runs first; a run busy right now is pruned next time.
  -- In no particular order: sorting every finished run to take a batch would cost more than
  -- deleting it, and skip locked never waits, so the order of these locks cannot deadlock.
  -- A subflow run goes with its top run (engine 0028), never alone.
  v_runs := array(
    select r.run_id from pgflow.runs as r
    where ((r.status = 'completed' and r.completed_at < v_cutoff)
       or (r.status = 'failed' and r.failed_at < v_cutoff)
       or (r.status = 'cancelled' and r.cancelled_at < v_cutoff))
      and r.parent_run_id is null
    limit batch_size
    for update skip locked
  );
  if cardinality(v_runs) = batch_size then
    v_done := false;
  end if;
  if cardinality(v_runs) = 0 then
    v_runs := null;
  end if;
  v_top_runs := coalesce(cardinality(v_runs), 0);
  -- Their subflow runs, however deep (all finished with them: a finished run ended its children).
  if v_runs is not null and exists (
    select 1 from pgflow.runs as c where c.parent_run_id = any (v_runs)
  ) then
    v_runs := v_runs || array(
      with recursive down (run_id) as (
        select c.run_id from pgflow.runs as c where c.parent_run_id = any (v_runs)
        union all
        select c.run_id from down as d join pgflow.runs as c on c.parent_run_id = d.run_id
      )
      select d.run_id from down as d
      join pgflow.runs as r on r.run_id = d.run_id
      order by d.run_id
      for update of r
    );
  end if;

  if v_runs is not null then
    -- The tasks' messages still in their queues go with them, or they would come back after every
    -- lease with no task to claim (a run failed by hand, a task parked by stall recovery).
    with gone as (
      delete from pgflow.step_tasks as t where t.run_id = any (v_runs)
      returning t.queue_name, t.message_id
    )
    select array_agg(g.queue_name), array_agg(g.message_id) into v_queues, v_messages
    from gone as g where g.message_id is not null;
    for v_queue in select distinct q from unnest(v_queues) as q loop
      continue when to_regclass(format('pgmq.%I', pgflow.pgmq_table_name(v_queue))) is null;
      perform pgmq.delete(v_queue, array(
        select x.m from unnest(v_queues, v_messages) as x (q, m) where x.q = v_queue
      ));
    end loop;
    delete from pgflow.step_states as ss where ss.run_id = any (v_runs);
    delete from pgflow.operator_actions as a where a.run_id = any (v_runs);
    delete from pgflow.runs as r where r.run_id = any (v_runs);
  end if;
  -- Actions on a step rather than a run (a pause, a resume) go with age.
  delete from pgflow.operator_actions as a where a.run_id is null and a.acted_at < v_cutoff;
  -- The starts table triggers skipped (engine 0032), with age too.
  delete from pgflow.trigger_skips as k where k.skipped_at < v_cutoff;

  delete from pgflow.workers as w where w.last_heartbeat_at < v_cutoff;
  get diagnostics v_workers = row_count;

  for v_queue in
    select s.queue_name from pgflow.steps as s
    union
    select pgflow.default_queue_name(f.flow_slug) from pgflow.flows as f where f.queue_mode = 'flow'
  loop
    continue when to_regclass(format('pgmq.%I', pgflow.pgmq_table_name(v_queue, 'a'))) is null;
    execute format(
      'delete from pgmq.%1$I where msg_id in'
      ' (select a.msg_id from pgmq.%1$I as a where a.archived_at < $1 limit $2)',
      pgflow.pgmq_table_name(v_queue, 'a'))
      using v_cutoff, batch_size;
    get diagnostics v_count = row_count;
    v_archived := v_archived + v_count;
    if v_count = batch_size then
      v_done := false;
    end if;
  end loop;

  return jsonb_build_object(
    'runs', v_top_runs, 'subflow_runs', coalesce(cardinality(v_runs), 0) - v_top_runs, 'workers', v_workers, 'archived_messages', v_archived,
    'done', v_done
  );
end;
$$;

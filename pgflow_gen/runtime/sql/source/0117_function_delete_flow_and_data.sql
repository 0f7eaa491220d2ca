-- Deletes a flow's definition and all its runtime data (archiving its unfinished tasks' messages),
-- and drops the queues its queue mode owns: the steps' routes, plus the default queue in flow mode
-- only (a step-queued flow never touches an unrelated queue of that name). A queue is dropped
-- under the spelling PGMQ lists for it (two spellings are refused as ambiguous), and kept while
-- another flow still routes to it.
-- Its step roles (pgflow.step_roles) stay bound to their steps' names (engine 0020): they work on
-- nothing until the flow is applied again with those steps, and never as plain workers; a notice
-- names them.
-- A flow that another flow starts as a subflow is refused (55000); the subflow runs of this flow's
-- runs lose their parent and, when still running, are cancelled (engine 0028). Its table
-- triggers are dropped (engine 0032).
-- Takes the flow's definition lock, then its runs' row locks; does nothing for an unknown flow.
create function pgflow.delete_flow_and_data(flow_slug text)
returns void
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_queues text[];
  v_queue text;
  v_active_queues text[];
  v_active_messages bigint[];
  v_mode text;
  v_listed text[];
  v_bound text;
  v_user record;
  v_child record;
begin
  perform pgflow._lock_flow_definition(flow_slug);
  select f.queue_mode into v_mode from pgflow.flows as f where f.flow_slug = delete_flow_and_data.flow_slug;
  if not found then
    return;
  end if;
  -- GUARD: a flow another flow starts as a subflow stays (engine 0028): deleting it would leave
  -- that flow's subflow tasks waiting for runs that are gone.
  select s.flow_slug, s.step_slug into v_user from pgflow.steps as s
  where s.subflow_slug = delete_flow_and_data.flow_slug and s.flow_slug <> delete_flow_and_data.flow_slug
  order by s.flow_slug, s.step_index
  limit 1;
  if found then
    raise exception 'Flow "%" is the subflow of step "%" of flow "%", so it cannot be deleted.',
      flow_slug, v_user.step_slug, v_user.flow_slug
      using errcode = '55000', hint = format('Nothing was deleted. Delete flow "%s" first.', v_user.flow_slug);
  end if;

  v_queues := array(
    select s.queue_name from pgflow.steps as s where s.flow_slug = delete_flow_and_data.flow_slug
    union
    select pgflow.default_queue_name(delete_flow_and_data.flow_slug) where v_mode = 'flow'
  );

  -- Same lock order as the task callbacks: runs first (in key order), then their rows.
  perform 1 from pgflow.runs as r
  where r.flow_slug = delete_flow_and_data.flow_slug
  order by r.run_id
  for update;

  -- The subflow runs its runs started (engine 0028) lose their parent, and the ones still
  -- running are cancelled: their flow stays, their parents go.
  for v_child in
    update pgflow.runs as c set parent_run_id = null, parent_step_slug = null, parent_task_index = null
    where c.parent_run_id in (select r.run_id from pgflow.runs as r where r.flow_slug = delete_flow_and_data.flow_slug)
      and c.flow_slug <> delete_flow_and_data.flow_slug
    returning c.run_id, c.status
  loop
    if v_child.status = 'started' then
      perform pgflow._cancel_run(v_child.run_id,
        format('Its parent run was deleted with flow "%s".', delete_flow_and_data.flow_slug));
    end if;
  end loop;

  -- Messages of unfinished tasks go too (their task rows locked first, in key order, as claims
  -- do): a queue shared with another flow survives this deletion.
  with active as (
    select t.queue_name, t.message_id from pgflow.step_tasks as t
    where t.flow_slug = delete_flow_and_data.flow_slug and t.status in ('queued', 'started')
    order by t.run_id, t.step_slug, t.task_index
    for update
  )
  select array_agg(a.queue_name), array_agg(a.message_id) into v_active_queues, v_active_messages
  from active as a;
  perform pgflow._archive_task_messages(v_active_queues, v_active_messages);

  foreach v_queue in array v_queues loop
    perform pgflow.archive_completed_messages(v_queue);
  end loop;
  delete from pgflow.step_tasks as t where t.flow_slug = delete_flow_and_data.flow_slug;
  delete from pgflow.step_states as s where s.flow_slug = delete_flow_and_data.flow_slug;
  delete from pgflow.runs as r where r.flow_slug = delete_flow_and_data.flow_slug;
  delete from pgflow.deps as d where d.flow_slug = delete_flow_and_data.flow_slug;
  delete from pgflow.steps as s where s.flow_slug = delete_flow_and_data.flow_slug;
  delete from pgflow.flows as f where f.flow_slug = delete_flow_and_data.flow_slug;
  -- Its table triggers go too (engine 0032): writes to their tables start nothing any more.
  perform pgflow._drop_flow_triggers(flow_slug);
  select string_agg(r.role_name, ', ' order by r.role_name) into v_bound
  from pgflow.step_roles as r where r.flow_slug = delete_flow_and_data.flow_slug;
  if v_bound is not null then
    raise notice 'Step roles of flow "%" stay bound to their steps: %.', flow_slug, v_bound
      using detail = 'They work on nothing until the flow is applied again with those steps, and never as plain workers.',
        hint = '`pgflow-gen db roles` lists step roles whose step does not exist; drop those no longer needed.';
  end if;

  foreach v_queue in array v_queues loop
    continue when exists (select 1 from pgflow.steps as s where s.queue_name = v_queue)
      or exists (select 1 from pgflow.flows as f where f.queue_mode = 'flow' and pgflow.default_queue_name(f.flow_slug) = v_queue);
    v_listed := array(select q.queue_name from pgmq.list_queues() as q where lower(q.queue_name) = v_queue);
    if cardinality(v_listed) > 1 then
      -- PGMQ names a queue's tables in lowercase: these spellings are one physical queue.
      raise exception 'The queue "%" of flow "%" is ambiguous.', v_queue, flow_slug
        using errcode = '42710',
          detail = format('PGMQ lists %s for the same tables; nothing was deleted.', array_to_string(v_listed, ', ')),
          hint = 'Remove the extra rows from pgmq.meta (never pgmq.drop_queue, which drops the shared tables), then delete again.';
    end if;
    if cardinality(v_listed) = 1 then
      perform pgmq.drop_queue(v_listed[1]);
    end if;
    delete from pgflow.archivable_messages as m where m.queue_name = v_queue;
  end loop;
end;
$$;

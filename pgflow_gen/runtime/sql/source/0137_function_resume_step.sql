-- Resumes a paused step: its held messages are visible again at once (those waiting for a
-- retry's delay keep waiting) and its queues' workers are woken, so its tasks start now. Resuming a step that
-- is not paused changes nothing. Returns how many messages were shown again.
-- Locks the held messages' task rows before their PGMQ rows, as every claim does.
create function pgflow.resume_step(flow_slug text, step_slug text)
returns int
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_queue text;
  v_messages bigint[];
  v_count int;
  v_shown int := 0;
begin
  perform pgflow._require_step(flow_slug, step_slug);
  for v_queue, v_messages in
    with locked as (
      select t.queue_name, t.message_id
      from pgflow.held_messages as m
      join pgflow.step_tasks as t on t.queue_name = m.queue_name and t.message_id = m.message_id
      where m.flow_slug = resume_step.flow_slug and m.step_slug = resume_step.step_slug
        and t.status = 'queued'
      order by t.run_id, t.step_slug, t.task_index
      for update of t
    )
    select l.queue_name, array_agg(l.message_id order by l.message_id)
    from locked as l
    group by l.queue_name
  loop
    select count(*) into v_count
    from pgflow._set_vt_batch(v_queue, v_messages, array_fill(0, array[cardinality(v_messages)]));
    v_shown := v_shown + v_count;
    -- Wake the queue's workers as an insert would, rather than leave it to their next poll.
    perform pg_notify('pgmq.' || pgflow.pgmq_table_name(v_queue) || '.INSERT', '');
  end loop;
  delete from pgflow.step_pauses as p
  where p.flow_slug = resume_step.flow_slug and p.step_slug = resume_step.step_slug;
  perform pgflow._record_action('resume', flow_slug, null, step_slug, null);
  return v_shown;
end;
$$;

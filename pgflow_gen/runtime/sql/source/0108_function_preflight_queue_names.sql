-- Checks, before any definition or queue is written, that flow_slug may own every queue in
-- queue_names: a name derived or referenced by another flow is rejected, and so is a queue PGMQ
-- already lists that this flow's current definition does not own (pgflow never adopts a queue),
-- or one listed under a different spelling. A flow reuses its own queues. Definition lock held.
create function pgflow._preflight_queue_names(flow_slug text, queue_names text[])
returns void
language plpgsql
stable
set search_path = ''
as $$
declare
  v_queue text;
  v_other text;
  v_listed text[];
  v_owned boolean;
  v_all_listed text[] := array(select q.queue_name from pgmq.list_queues() as q);
begin
  foreach v_queue in array array(select distinct n from unnest(queue_names) as n order by n) loop
    perform pgmq.validate_queue_name(v_queue);

    select f.flow_slug into v_other
    from pgflow.flows as f
    where f.flow_slug <> _preflight_queue_names.flow_slug
      and ((f.queue_mode = 'flow' and pgflow.default_queue_name(f.flow_slug) = v_queue)
        or exists (select 1 from pgflow.steps as s where s.flow_slug = f.flow_slug and s.queue_name = v_queue))
    order by f.flow_slug
    limit 1;
    if v_other is not null then
      raise exception 'Flow "%" cannot use the queue "%": flow "%" already uses it.', flow_slug, v_queue, v_other
        using errcode = '42710',
          detail = 'Every pgflow queue belongs to exactly one concrete flow.',
          hint = 'Rename one of the flows.';
    end if;

    v_listed := array(select l from unnest(v_all_listed) as l where lower(l) = v_queue order by l);
    continue when cardinality(v_listed) = 0;
    v_owned := exists (
      select 1 from pgflow.flows as f
      where f.flow_slug = _preflight_queue_names.flow_slug
        and ((f.queue_mode = 'flow' and pgflow.default_queue_name(f.flow_slug) = v_queue)
          or exists (select 1 from pgflow.steps as s where s.flow_slug = f.flow_slug and s.queue_name = v_queue))
    );
    if not v_owned then
      raise exception 'Flow "%" cannot use the queue "%": a queue of that name already exists.', flow_slug, v_queue
        using errcode = '42710',
          detail = format('PGMQ lists %s, which no pgflow definition owns; pgflow never adopts a queue it did not create.',
            array_to_string(v_listed, ', ')),
          hint = 'Drop or rename the existing queue (pgmq.drop_queue), or rename the flow.';
    end if;
    if v_listed <> array[v_queue] then
      raise exception 'The queue "%" of flow "%" is ambiguous.', v_queue, flow_slug
        using errcode = '42710',
          detail = format('PGMQ lists %s for it; PGMQ names the tables in lowercase, so these spellings are one physical queue.',
            array_to_string(v_listed, ', ')),
          hint = 'Remove the extra spellings'' rows from pgmq.meta (never pgmq.drop_queue, which drops the shared tables).';
    end if;
  end loop;
end;
$$;

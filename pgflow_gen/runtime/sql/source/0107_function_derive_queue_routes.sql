-- The one canonical queue resolver: the route of every step, in step order (step_index is the
-- zero-based position in step_slugs). Queue mode "flow" routes every step to its default queue;
-- "step" uses lower(flow__step) when it fits PGMQ's 47 characters, else lower(flow__<index>), else
-- rejects the flow. Names are never truncated or hashed. Pure: it raises (SQLSTATE 22023, with the
-- MESSAGE / DETAIL / HINT texts of pgflow_gen.naming) and writes nothing.
create function pgflow.derive_queue_routes(flow_slug text, step_slugs text[], queue_mode text)
returns table (step_slug text, step_index int, queue_name text)
language plpgsql
stable
set search_path = ''
as $$
declare
  c_max constant int := 47;
  c_slug_hint constant text := 'Use 1-128 ASCII letters, digits and single underscores, starting with a letter and not ending with "_", for example "greetUser" or "greet_user".';
  v_slugs text[] := coalesce(step_slugs, '{}');
  v_count int := cardinality(coalesce(step_slugs, '{}'));
  v_violation text;
  v_step text;
  v_first int;
  v_readable text;
  v_fallback text;
  v_queue text;
  v_queues text[] := '{}';
begin
  if queue_mode is null or queue_mode not in ('flow', 'step') then
    raise exception 'Unknown queue mode "%" for flow "%".', queue_mode, flow_slug
      using errcode = '22023',
        hint = 'Use "flow" (one queue for the flow) or "step" (a private queue per step).';
  end if;
  v_violation := pgflow._slug_violation(flow_slug);
  if v_violation is not null then
    raise exception 'Invalid flow slug "%".', flow_slug
      using errcode = '22023', detail = format('The slug is invalid: %s.', v_violation), hint = c_slug_hint;
  end if;
  for i in 1 .. v_count loop
    v_step := v_slugs[i];
    v_violation := pgflow._slug_violation(v_step);
    if v_violation is not null then
      raise exception 'Invalid step slug "%" in flow "%".', v_step, flow_slug
        using errcode = '22023', detail = format('The slug is invalid: %s.', v_violation), hint = c_slug_hint;
    end if;
    v_first := (select min(j) from generate_subscripts(v_slugs, 1) as j where j < i and lower(v_slugs[j]) = lower(v_step));
    if v_first is not null then
      raise exception 'Step slug "%" duplicates "%" in flow "%".', v_step, v_slugs[v_first], flow_slug
        using errcode = '22023',
          detail = format('Step slugs must be unique ignoring case; steps %s and %s both normalize to "%s".',
            v_first - 1, i - 1, lower(v_step)),
          hint = 'Rename one of the steps.';
    end if;
  end loop;

  if queue_mode = 'flow' then
    v_queue := pgflow.default_queue_name(flow_slug);
    if length(v_queue) > c_max then
      raise exception 'Flow "%" cannot use its default queue.', flow_slug
        using errcode = '22023',
          detail = format('The queue "%s" is %s characters; PGMQ allows at most %s.', v_queue, length(v_queue), c_max),
          hint = 'Shorten the concrete flow slug.';
    end if;
    perform pgmq.validate_queue_name(v_queue);
    return query select s.slug, (s.ordinality - 1)::int, v_queue
      from unnest(v_slugs) with ordinality as s (slug, ordinality);
    return;
  end if;

  if v_count = 0 then
    raise exception 'Flow "%" has no steps, so it cannot use per-step queues.', flow_slug
      using errcode = '22023', hint = 'Add at least one step, or use the default single queue.';
  end if;
  v_fallback := lower(flow_slug || '__0');
  if length(v_fallback) > c_max then
    raise exception 'Flow "%" cannot use per-step queues.', flow_slug
      using errcode = '22023',
        detail = format('The shortest required queue "%s" is %s characters; PGMQ allows at most %s.',
          v_fallback, length(v_fallback), c_max),
        hint = 'Shorten the concrete flow slug or use the default single queue.';
  end if;
  for i in 1 .. v_count loop
    v_step := v_slugs[i];
    v_readable := lower(flow_slug || '__' || v_step);
    v_fallback := lower(flow_slug || '__' || (i - 1));
    if length(v_readable) <= c_max then
      v_queue := v_readable;
    elsif length(v_fallback) <= c_max then
      v_queue := v_fallback;
    else
      raise exception 'Cannot derive a queue for step "%" at index % in flow "%".', v_step, i - 1, flow_slug
        using errcode = '22023',
          detail = format('The readable name is %s characters and the index fallback is %s; PGMQ allows at most %s.',
            length(v_readable), length(v_fallback), c_max),
          hint = 'Shorten the concrete flow slug, shorten the step slug enough for the readable name, or use the default single queue.';
    end if;
    v_first := array_position(v_queues, v_queue);
    if v_first is not null then
      raise exception 'Steps "%" and "%" of flow "%" would share the queue "%".', v_slugs[v_first], v_step, flow_slug, v_queue
        using errcode = '22023',
          detail = 'Every step of a step-queued flow needs a queue of its own.',
          hint = 'Rename one of the steps.';
    end if;
    perform pgmq.validate_queue_name(v_queue);
    v_queues := v_queues || v_queue;
  end loop;
  return query select s.slug, (s.ordinality - 1)::int, s.name
    from unnest(v_slugs, v_queues) with ordinality as s (slug, name, ordinality);
end;
$$;

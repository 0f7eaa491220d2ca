-- Defines a flow-mode flow and creates its default queue. Idempotent: an existing flow is
-- returned as it is, and different options for it are an error, never a silent change. A slug
-- differing only in case from an existing flow, an existing step-queued flow, or a queue pgflow
-- does not own is rejected.
-- Takes the flow's definition lock.
create function pgflow.create_flow(
  flow_slug text,
  max_attempts int default null,
  base_delay int default null,
  timeout int default null
)
returns pgflow.flows
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_flow pgflow.flows;
  v_queue text := pgflow.default_queue_name(flow_slug);
begin
  -- GUARD: the slug rules and the default queue's length, with the resolver's errors.
  perform from pgflow.derive_queue_routes(flow_slug, '{}', 'flow');

  perform pgflow._lock_flow_definition(flow_slug);

  select * into v_flow from pgflow.flows as f where lower(f.flow_slug) = lower(create_flow.flow_slug);
  if found and v_flow.flow_slug <> create_flow.flow_slug then
    raise exception 'Flow "%" differs only in case from the existing flow "%".', flow_slug, v_flow.flow_slug
      using errcode = '23505',
        detail = 'Flow slugs are unique ignoring case.',
        hint = 'Use the existing spelling, or a different flow slug.';
  end if;
  if found and v_flow.queue_mode <> 'flow' then
    raise exception 'Flow "%" uses per-step queues; create_flow defines flow-mode flows only.', flow_slug
      using errcode = '55000',
        hint = 'A step-queued flow is defined as a whole by pgflow.ensure_flow_compiled().';
  end if;
  if found then
    if (max_attempts is not null and max_attempts <> v_flow.opt_max_attempts)
      or (base_delay is not null and base_delay <> v_flow.opt_base_delay)
      or (timeout is not null and timeout <> v_flow.opt_timeout) then
      raise exception 'Flow "%" already exists with different options.', flow_slug
        using errcode = '23505',
          detail = format('existing max_attempts=%s, base_delay=%s, timeout=%s',
            v_flow.opt_max_attempts, v_flow.opt_base_delay, v_flow.opt_timeout),
          hint = 'Change options of an existing flow with UPDATE pgflow.flows, or use a new flow slug.';
    end if;
    return v_flow;
  end if;

  perform pgflow._preflight_queue_names(flow_slug, array[v_queue]);
  v_flow := pgflow._insert_flow(flow_slug, 'flow', max_attempts, base_delay, timeout);
  perform pgmq.create(v_queue);
  perform pgflow._create_priority_index(v_queue);
  return v_flow;
end;
$$;

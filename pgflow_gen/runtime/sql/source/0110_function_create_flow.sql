-- Defines a flow-mode flow and creates its queue lower(flow_slug). Idempotent: an existing flow is
-- returned as it is, and different options for it are an error, never a silent change.
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
set search_path = ''
as $$
declare
  v_flow pgflow.flows;
  v_queue text := lower(flow_slug);
begin
  if not pgflow.is_valid_slug(flow_slug) then
    raise exception 'Invalid flow slug "%".', flow_slug
      using errcode = '22023',
        detail = 'A slug has 1 to 128 characters: ASCII letters, digits and "_", not starting with a digit, and is not "run".',
        hint = 'Rename the flow, for example "myFlow" or "my_flow".';
  end if;
  if length(v_queue) > 47 then
    raise exception 'Flow slug "%" is too long for its queue name.', flow_slug
      using errcode = '22023',
        detail = format('The queue "%s" would have %s characters; PGMQ allows at most 47.', v_queue, length(v_queue)),
        hint = 'Shorten the flow slug.';
  end if;
  if max_attempts < 1 or base_delay < 0 or timeout < 1 then
    raise exception 'Invalid options for flow "%".', flow_slug
      using errcode = '22023',
        detail = format('max_attempts=%s, base_delay=%s, timeout=%s', max_attempts, base_delay, timeout),
        hint = 'max_attempts must be at least 1, base_delay at least 0 and timeout at least 1.';
  end if;

  perform pgflow._lock_flow_definition(flow_slug);

  select * into v_flow from pgflow.flows as f where f.flow_slug = create_flow.flow_slug;
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

  insert into pgflow.flows (flow_slug, opt_max_attempts, opt_base_delay, opt_timeout)
  values (flow_slug, coalesce(max_attempts, 3), coalesce(base_delay, 5), coalesce(timeout, 60))
  returning * into v_flow;

  if not exists (select 1 from pgmq.meta as m where lower(m.queue_name) = v_queue) then
    perform pgmq.create(v_queue);
  end if;
  return v_flow;
end;
$$;

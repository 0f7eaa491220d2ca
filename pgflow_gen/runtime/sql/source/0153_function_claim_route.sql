-- The route a claim takes its tasks from, checked once per claim (engine 0014): the flow's queue
-- mode decides the selector (a step-queued flow claims one step, named exactly, from that step's
-- own queue; a flow-mode flow takes no step). Returns the queue, the steps whose tasks the claim
-- may start with their effective timeouts, and the lease each claimed message gets when those
-- timeouts agree (timeout + 2 s; null when they differ). Raises on a wrong selector, and on a queue
-- that is not the route's (engine 0020: in flow mode too); no writes.
-- Called by claim_tasks and read_and_claim.
create function pgflow._claim_route(
  flow_slug text,
  queue_name text,
  step_slug text,
  out queue text,
  out step_slugs text[],
  out timeouts int[],
  out lease int
)
language plpgsql
stable
set search_path = ''
as $$
declare
  v_mode text;
  v_flow_timeout int;
  v_route text;
  v_twin text;
begin
  perform pgflow._require_step_route(flow_slug, step_slug);
  if queue_name is null then
    raise exception 'A claim needs the queue the messages were read from.' using errcode = '22004';
  end if;
  select f.queue_mode, f.opt_timeout into v_mode, v_flow_timeout
  from pgflow.flows as f where f.flow_slug = _claim_route.flow_slug;
  if not found then
    raise exception 'Flow "%" does not exist.', flow_slug using errcode = 'P0002';
  end if;
  queue := lower(queue_name);
  if v_mode = 'flow' and step_slug is not null then
    raise exception 'Flow "%" uses its default queue, so claiming takes no step slug.', flow_slug
      using errcode = '22023', hint = 'Claim without step_slug for a flow-mode flow.';
  end if;
  -- GUARD: a flow-mode claim reads only the flow's own queue (engine 0020), never another queue
  -- of PGMQ's (an application's own, or another flow's).
  if v_mode = 'flow' and queue <> pgflow.default_queue_name(flow_slug) then
    raise exception 'Flow "%" uses queue "%", not "%".', flow_slug, pgflow.default_queue_name(flow_slug), queue
      using errcode = '42501', hint = 'Claim with the messages read from the flow''s own queue.';
  end if;
  if v_mode = 'step' then
    if step_slug is null then
      raise exception 'Flow "%" uses per-step queues, so claiming needs the step slug.', flow_slug
        using errcode = '22023', hint = 'Pass step_slug => the step this worker runs, with that step''s queue.';
    end if;
    select s.queue_name into v_route from pgflow.steps as s
    where s.flow_slug = _claim_route.flow_slug and s.step_slug = _claim_route.step_slug;
    if not found then
      select s.step_slug into v_twin from pgflow.steps as s
      where s.flow_slug = _claim_route.flow_slug and lower(s.step_slug) = lower(_claim_route.step_slug);
      if v_twin is not null then
        raise exception 'Flow "%" has no step "%".', flow_slug, step_slug
          using errcode = '22023', detail = format('Step slugs match exactly; did you mean "%s"?', v_twin);
      end if;
      raise exception 'Flow "%" has no step "%".', flow_slug, step_slug using errcode = '22023';
    end if;
    if v_route <> queue_name then
      raise exception 'Step "%" of flow "%" is routed to queue "%", not "%".', step_slug, flow_slug, v_route, queue_name
        using errcode = '22023', hint = 'Claim with the messages read from the step''s own queue.';
    end if;
    queue := v_route;
  end if;
  select array_agg(s.step_slug order by s.step_index),
    array_agg(coalesce(s.opt_timeout, v_flow_timeout) order by s.step_index),
    case when min(coalesce(s.opt_timeout, v_flow_timeout)) = max(coalesce(s.opt_timeout, v_flow_timeout))
      then max(coalesce(s.opt_timeout, v_flow_timeout)) + 2 end
  into step_slugs, timeouts, lease
  from pgflow.steps as s
  where s.flow_slug = _claim_route.flow_slug and s.step_type <> 'signal' and s.subflow_slug is null
    and (_claim_route.step_slug is null or s.step_slug = _claim_route.step_slug);
end;
$$;

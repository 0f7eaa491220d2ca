-- Writes one flow row in the given queue mode after checking its options; no queue is created.
-- Used by create_flow and by the compilation of step-queued flows, under the definition lock.
create function pgflow._insert_flow(
  flow_slug text,
  queue_mode text,
  max_attempts int,
  base_delay int,
  timeout int
)
returns pgflow.flows
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_flow pgflow.flows;
begin
  if max_attempts < 1 or base_delay < 0 or timeout < 1 then
    raise exception 'Invalid options for flow "%".', flow_slug
      using errcode = '22023',
        detail = format('max_attempts=%s, base_delay=%s, timeout=%s', max_attempts, base_delay, timeout),
        hint = 'max_attempts must be at least 1, base_delay at least 0 and timeout at least 1.';
  end if;
  insert into pgflow.flows (flow_slug, queue_mode, opt_max_attempts, opt_base_delay, opt_timeout)
  values (flow_slug, queue_mode, coalesce(max_attempts, 3), coalesce(base_delay, 5), coalesce(timeout, 60))
  returning * into v_flow;
  return v_flow;
end;
$$;

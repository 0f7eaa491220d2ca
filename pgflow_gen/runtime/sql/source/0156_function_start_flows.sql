-- Starts many runs of one flow in one call (engine 0014), as start_flow would for each input in
-- turn, in one transaction, and returns the runs in input order (pgflow._start_runs). With
-- idempotency_keys (one per input, null elements for none), an input whose key some run of
-- this flow already has returns that run as it is and starts nothing (so does a key repeated in
-- the call: its first input wins), also when calls race. An input that is SQL NULL, or not an
-- array where a root map step maps it, raises naming its position (from 1), and nothing
-- starts. Holds the flow's definition lock shared, as start_flow does, and keeps the caller's
-- trace context as start_flow does (engine 0016). Every new run gets priority, as start_flow
-- gives it (engine 0031).
create function pgflow.start_flows(
  flow_slug text, inputs jsonb[], idempotency_keys text[] default null, priority int default 0
)
returns setof pgflow.runs
language plpgsql
volatile
security definer
set search_path = ''
as $$
begin
  return query select * from pgflow._start_runs(flow_slug, inputs, idempotency_keys, priority => priority);
end;
$$;

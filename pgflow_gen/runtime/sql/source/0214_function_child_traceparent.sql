-- The trace context of a new subflow run of flow_slug under parent_run_id (engine 0028): the
-- parent's stored context, else the one workers derive for a run without one (trace id: the run
-- id; parent span: its low 64 bits), so the child's tasks join the parent's trace either way.
-- Raises 54000 (program_limit_exceeded) when the child would nest more than 8 deep below a top
-- run (a cycle of flows made in plain SQL ends here too). No writes, no locks.
create function pgflow._child_traceparent(parent_run_id uuid, flow_slug text)
returns text
language plpgsql
stable
set search_path = ''
as $$
declare
  v_depth int;
  v_parent_trace text;
  v_parent_flow text;
  v_hex text := replace(parent_run_id::text, '-', '');
begin
  select count(*), (array_agg(a.traceparent order by a.depth))[1], (array_agg(a.flow_slug order by a.depth))[1]
  into v_depth, v_parent_trace, v_parent_flow
  from pgflow._run_ancestors(_child_traceparent.parent_run_id) as a;
  if v_depth > 8 then
    raise exception 'Run % of flow "%" cannot start a subflow run of flow "%": subflows nest at most 8 deep.',
      parent_run_id, v_parent_flow, flow_slug
      using errcode = '54000', hint = 'Check the flows for a cycle: a flow that is its own subflow, directly or not.';
  end if;
  return coalesce(v_parent_trace,
    format('00-%s-%s-01', v_hex, coalesce(nullif(right(v_hex, 16), '0000000000000000'), '0000000000000001')));
end;
$$;

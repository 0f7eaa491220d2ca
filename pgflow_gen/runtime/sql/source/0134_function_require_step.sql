-- Raises no_data_found unless the flow has the step (for the functions that name one).
create function pgflow._require_step(flow_slug text, step_slug text)
returns void
language plpgsql
stable
set search_path = ''
as $$
begin
  if not exists (select 1 from pgflow.flows as f where f.flow_slug = _require_step.flow_slug) then
    raise exception 'Flow "%" does not exist.', flow_slug
      using errcode = 'P0002', hint = 'Check the slug (it is case-sensitive) or compile the flow first.';
  end if;
  if not exists (
    select 1 from pgflow.steps as s
    where s.flow_slug = _require_step.flow_slug and s.step_slug = _require_step.step_slug
  ) then
    raise exception 'Flow "%" has no step "%".', flow_slug, step_slug
      using errcode = 'P0002', hint = 'Step slugs are case-sensitive; `pgflow-gen flows` lists them.';
  end if;
end;
$$;

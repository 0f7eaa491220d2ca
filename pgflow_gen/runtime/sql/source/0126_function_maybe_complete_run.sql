-- Completes a started run once no step remains; its output maps each completed leaf step (one
-- that nothing depends on) to its output, and is null when every leaf was skipped.
-- A subflow run's completion completes its parent's task (engine 0028). Caller holds the run row lock.
create function pgflow._maybe_complete_run(run_id uuid)
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_parent_run_id uuid;
begin
  update pgflow.runs as r
  set status = 'completed', completed_at = clock_timestamp(), output = (
    select jsonb_object_agg(ss.step_slug, ss.output)
    from pgflow.step_states as ss
    where ss.run_id = r.run_id and ss.status = 'completed'
      and not exists (
        select 1 from pgflow.deps as d where d.flow_slug = ss.flow_slug and d.dep_slug = ss.step_slug
      )
  )
  where r.run_id = _maybe_complete_run.run_id and r.status = 'started' and r.remaining_steps = 0
  returning r.parent_run_id into v_parent_run_id;
  if found then
    perform pgflow._emit_event(run_id, 'run:completed', null, 'completed');
    -- A subflow run completes its parent's task (engine 0028).
    if v_parent_run_id is not null then
      perform pgflow._settle_parent_task(run_id);
    end if;
  end if;
end;
$$;

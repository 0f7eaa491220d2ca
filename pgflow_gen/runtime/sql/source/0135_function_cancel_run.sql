-- Cancels a started run (pgflow._cancel_run: its unfinished steps and tasks are cancelled, its
-- subflow runs too, engine 0028) and records the operator's action. A run that is not started
-- raises (object_not_in_prerequisite_state) and changes nothing; an unknown one raises P0002.
-- Locks the run, its step states and its tasks, in that order, as every callback does.
create function pgflow.cancel_run(run_id uuid, reason text default null)
returns pgflow.runs
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_run pgflow.runs;
begin
  select * into v_run from pgflow.runs as r where r.run_id = cancel_run.run_id for update;
  if not found then
    raise exception 'Run % does not exist.', run_id using errcode = 'P0002';
  end if;
  if v_run.status <> 'started' then
    raise exception 'Run % is % already; only a started run can be cancelled.', run_id, v_run.status
      using errcode = '55000', hint = 'Nothing was changed.';
  end if;
  v_run := pgflow._cancel_run(run_id, reason);
  perform pgflow._record_action('cancel', v_run.flow_slug, run_id, null,
    case when reason is not null then jsonb_build_object('reason', reason) end);
  return v_run;
end;
$$;

-- Retries a failed run from where it failed (pgflow._retry_run: its unfinished tasks run again,
-- completed ones keep their outputs), and records the operator's action. Refused, changing
-- nothing: an unknown run (P0002); a run that is not failed, a subflow run (engine 0028: its
-- parent's task retries it, and retry_run of the parent resumes it), or one whose flow has gained
-- a step since it started (55000). Locks the run, its step states and its tasks, in that order.
create function pgflow.retry_run(run_id uuid)
returns pgflow.runs
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_run pgflow.runs;
  v_added text;
begin
  select * into v_run from pgflow.runs as r where r.run_id = retry_run.run_id for update;
  if not found then
    raise exception 'Run % does not exist.', run_id using errcode = 'P0002';
  end if;
  if v_run.status <> 'failed' then
    raise exception 'Run % is %; only a failed run can be retried.', run_id, v_run.status
      using errcode = '55000', hint = 'Nothing was changed.';
  end if;
  if v_run.parent_run_id is not null then
    raise exception 'Run % is a subflow run of run %: retry that run.', run_id, v_run.parent_run_id
      using errcode = '55000',
        detail = format('It runs for task %s of step "%s", whose retries start it again.', v_run.parent_task_index,
          v_run.parent_step_slug),
        hint = 'Nothing was changed. Retrying the parent run resumes this one where it failed.';
  end if;
  v_added := pgflow._retry_run(run_id, 0);
  if v_added is not null then
    raise exception 'Run % cannot be retried: flow "%" has changed since it started.', run_id, v_run.flow_slug
      using errcode = '55000', detail = format('Step "%s" was added to the flow after the run started.', v_added),
        hint = 'Nothing was changed. Start a new run.';
  end if;
  perform pgflow._record_action('retry', v_run.flow_slug, run_id, null, null);
  select * into v_run from pgflow.runs as r where r.run_id = retry_run.run_id;
  return v_run;
end;
$$;

-- Starts the child run of one task of a subflow step (engine 0028) with the given input, and
-- returns null; or, when the child cannot start (no such flow, SQL NULL input, a root map given
-- no array, nested more than 8 deep), changes nothing and returns the error, for the caller to
-- fail the task with. Only those errors are caught: any other (a lock timeout, a serialization
-- failure) aborts the caller's transaction as it would without a subflow.
-- Caller holds the parent run's row lock and the task is started.
create function pgflow._start_subflow_child(
  run_id uuid, step_slug text, task_index int, subflow_slug text, input jsonb
)
returns text
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_message text;
  v_hint text;
begin
  perform pgflow._start_runs(subflow_slug, array[input], null, run_id, step_slug, array[task_index]);
  return null;
exception when no_data_found or null_value_not_allowed or invalid_parameter_value
  or program_limit_exceeded then
  get stacked diagnostics v_message = message_text, v_hint = pg_exception_hint;
  return format('The subflow run could not start: %s', v_message)
    || case when v_hint <> '' then E'\n' || v_hint else '' end;
end;
$$;

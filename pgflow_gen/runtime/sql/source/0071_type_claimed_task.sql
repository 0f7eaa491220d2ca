-- What claim_tasks returns for each claimed task: step_task_record's columns, then the attempt
-- this claim started (attempts_count after the claim; callbacks pass it back) and the step's
-- effective timeout in seconds.
create type pgflow.claimed_task as (
  flow_slug text,
  run_id uuid,
  step_slug text,
  input jsonb,
  msg_id bigint,
  task_index int,
  flow_input jsonb,
  attempt int,
  timeout int
);

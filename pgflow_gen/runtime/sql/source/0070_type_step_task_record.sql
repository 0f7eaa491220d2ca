-- What start_tasks returns for each claimed task: its key, its assembled input and, for root
-- single steps only, the run input (map tasks never duplicate a large input).
create type pgflow.step_task_record as (
  flow_slug text,
  run_id uuid,
  step_slug text,
  input jsonb,
  msg_id bigint,
  task_index int,
  flow_input jsonb
);

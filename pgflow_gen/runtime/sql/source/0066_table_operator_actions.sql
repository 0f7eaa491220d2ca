-- What operators did to runs and steps from the dashboard (engine 0016): cancel, retry, pause,
-- resume, signal; who (the dashboard's actor) and when, written in the action's own transaction
-- and shown on the run's timeline. Pruned with its run (pgflow.prune_data_older_than), and with
-- its flow (the foreign key cascades when pgflow.delete_flow_and_data deletes the flow).
create table pgflow.operator_actions (
  action_id bigint generated always as identity primary key,
  action text not null,
  actor text not null,
  run_id uuid,
  flow_slug text not null references pgflow.flows (flow_slug) on delete cascade,
  step_slug text,
  detail jsonb,
  acted_at timestamptz not null default now()
);

create index operator_actions_run_id_idx on pgflow.operator_actions (run_id);
create index operator_actions_flow_slug_idx on pgflow.operator_actions (flow_slug);

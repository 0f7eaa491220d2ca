-- What operators did to runs, steps and schedules (engine 0016): cancel, retry, signal, pause,
-- resume, limits, pause_schedule, resume_schedule; shown on the run's timeline. Since engine 0020
-- the engine writes each row itself, inside the action's own function (pgflow._record_action),
-- whoever calls it (the dashboard, the CLI, an application, psql): `actor` is the login role
-- (session_user), `acted_at` the server's clock, and `label` what the caller said of itself (the
-- setting pgflow.action_label: the dashboard's client, the CLI's user), kept apart because no one
-- vouches for it. No role may insert directly. Pruned with its run
-- (pgflow.prune_data_older_than), and with its flow (the foreign key cascades when
-- pgflow.delete_flow_and_data deletes the flow).
create table pgflow.operator_actions (
  action_id bigint generated always as identity primary key,
  action text not null,
  actor text not null,
  run_id uuid,
  flow_slug text not null references pgflow.flows (flow_slug) on delete cascade,
  step_slug text,
  detail jsonb,
  acted_at timestamptz not null default now(),
  label text
);

create index operator_actions_run_id_idx on pgflow.operator_actions (run_id);
create index operator_actions_flow_slug_idx on pgflow.operator_actions (flow_slug);

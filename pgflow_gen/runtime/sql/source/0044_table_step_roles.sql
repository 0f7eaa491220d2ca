-- Per-step credentials (engine 0019): a login role listed here may claim, report on and read only
-- the tasks of its step route (a step of a step-queued flow); the engine checks the session's login
-- role (session_user) in pgflow._require_step_route and its callers. Roles not listed (members of
-- the group roles, the owner, superusers) are not restricted. Written by `pgflow-gen db roles
-- --per-step FLOW --apply`; a row goes with its step.
create table pgflow.step_roles (
  role_name text primary key,
  flow_slug text not null,
  step_slug text not null,
  foreign key (flow_slug, step_slug) references pgflow.steps (flow_slug, step_slug) on delete cascade
);

create index step_roles_flow_slug_step_slug_idx on pgflow.step_roles (flow_slug, step_slug);

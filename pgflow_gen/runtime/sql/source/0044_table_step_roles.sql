-- Per-step credentials (engine 0019): a login role listed here, or any role that belongs to one
-- (engine 0020: membership, pg_has_role, decides), may claim, report on and read only the tasks of
-- its step route (a step of a step-queued flow); pgflow._session_step_roles says which rows bind
-- the session, and pgflow._require_step_route and its siblings check them. Roles that belong to
-- none (members of the group roles only, the owner, superusers) are not restricted. Written by
-- `pgflow-gen db roles --per-step FLOW --apply`. A row outlives its step (engine 0020): deleting
-- or recompiling the flow leaves the role bound to that step's name, so it works on nothing until
-- the step exists again, and never falls back to a plain worker.
create table pgflow.step_roles (
  role_name text primary key,
  flow_slug text not null,
  step_slug text not null
);

create index step_roles_flow_slug_step_slug_idx on pgflow.step_roles (flow_slug, step_slug);

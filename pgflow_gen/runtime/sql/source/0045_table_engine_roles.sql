-- The group roles `pgflow-gen db roles --apply` granted the engine's functions to (engine 0019),
-- one per kind, so that `pgflow-gen db migrate` grants what later migrations add to the same
-- roles. Empty in a deployment that uses no roles (the owner or a superuser does everything).
create table pgflow.engine_roles (
  kind text primary key,
  role_name text not null,
  granted_at timestamptz not null default now(),
  constraint kind_is_known check (kind in ('admin', 'worker', 'client', 'reader'))
);

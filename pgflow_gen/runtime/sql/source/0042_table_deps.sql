-- Dependency edges: step_slug depends on dep_slug. Acyclic because a dependency must already exist
-- (steps are added in topological order). Written with the step by add_step.
create table pgflow.deps (
  flow_slug text not null,
  dep_slug text not null,
  step_slug text not null,
  created_at timestamptz not null default now(),
  primary key (flow_slug, dep_slug, step_slug),
  foreign key (flow_slug, dep_slug) references pgflow.steps (flow_slug, step_slug),
  foreign key (flow_slug, step_slug) references pgflow.steps (flow_slug, step_slug),
  constraint dep_is_not_self check (dep_slug <> step_slug)
);

create index deps_step_idx on pgflow.deps (flow_slug, step_slug);

-- The descriptions a flow has been given, by content: a description is the part of a spec that
-- is not its compared shape (the run input's schema, the flow's and the steps' options), hashed
-- with md5 over its jsonb text. The row adopted last is the one pgflow.flows and pgflow.steps
-- hold. A worker whose description is listed but not the latest is an older one (started during
-- a rollback, or still running through a rolling deploy) and changes nothing; see
-- _adopt_flow_description for who may adopt one again.
create table pgflow.flow_descriptions (
  flow_slug text not null references pgflow.flows (flow_slug) on delete cascade,
  description_hash text not null,
  first_seen_at timestamptz not null default now(),
  adopted_at timestamptz not null default now(),
  primary key (flow_slug, description_hash)
);

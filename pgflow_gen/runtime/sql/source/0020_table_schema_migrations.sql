-- Applied engine migrations with the checksum of the file that was applied.
-- Written only by `pgflow-gen db migrate` (or the SQL that `pgflow-gen db sql` prints).
create table pgflow.schema_migrations (
  version text primary key,
  name text not null,
  checksum text not null,
  applied_at timestamptz not null default now(),
  constraint version_is_numbered check (version ~ '^[0-9]{4}$')
);

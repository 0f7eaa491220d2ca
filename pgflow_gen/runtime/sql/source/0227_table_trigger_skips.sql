-- Starts a table trigger with `on_error: skip` could not make (engine 0032): the application's
-- write went on, and the run it should have started is here, with the input it would have had
-- and the error, for `pgflow-gen flows --skips` and for starting it by hand. Pruned with the
-- runs (pgflow.prune_data_older_than).
create table pgflow.trigger_skips (
  skip_id bigint generated always as identity primary key,
  flow_slug text not null,
  trigger_name text not null,
  table_name text not null,
  -- INSERT or UPDATE: the write that fired the trigger.
  operation text not null,
  input jsonb,
  sqlstate text not null,
  message text not null,
  skipped_at timestamptz not null default clock_timestamp()
);
create index trigger_skips_skipped_at on pgflow.trigger_skips (skipped_at);

-- The table triggers of a flow (engine 0032): a write to an application table starts a run of
-- the flow in the writing transaction. One row per trigger of the flow's spec, kept in step with
-- the spec by pgflow.set_flow_triggers (which the flow's generated migration calls); the
-- database trigger it created (pg_trigger_name on relid) calls pgflow._table_trigger, which
-- reads this row. Not tied to pgflow.flows by a foreign key: pgflow.delete_flow_and_data drops a
-- flow's database triggers with these rows, and a cascade would leave the triggers behind.
create table pgflow.flow_triggers (
  flow_slug text not null,
  -- The spec's name of the trigger, unique in its flow.
  trigger_name text not null,
  -- The table as applied (schema-qualified), its oid, and the database trigger's name on it.
  table_name text not null,
  relid oid not null,
  pg_trigger_name text not null,
  -- What set_flow_triggers was given for it ({"table", "on", "when", "input", "onError"}, with
  -- the defaults filled in), to compare with the next definition, and its `when` as the
  -- database trigger tests it (SQL on new and old; null: always).
  definition jsonb not null,
  condition text,
  -- raise: a start that fails aborts the write; skip: it is logged in pgflow.trigger_skips.
  on_error text not null,
  applied_at timestamptz not null default clock_timestamp(),
  primary key (flow_slug, trigger_name),
  constraint on_error_is_known check (on_error in ('raise', 'skip'))
);

-- Serialises every writer of one flow's definition (create_flow, add_step, ensure_flow_compiled,
-- delete_flow_and_data) with a transaction-scoped advisory lock keyed by the lower-cased slug.
create function pgflow._lock_flow_definition(flow_slug text)
returns void
language sql
volatile
set search_path = ''
as $$
  select pg_advisory_xact_lock(1, hashtext(lower(flow_slug)))
$$;

-- The default queue of a flow: the one queue of a flow-mode flow, lower(flow_slug). The one place
-- in SQL that spells this rule (pgflow_gen.naming.default_queue_name is its Python twin); every
-- function that needs the default queue calls it. Pure.
create function pgflow.default_queue_name(flow_slug text)
returns text
language sql
immutable
parallel safe
set search_path = ''
return lower(flow_slug);

-- The arguments of the database trigger of a flow's table trigger as pg_trigger.tgargs keeps
-- them (each NUL-terminated), so that it is found whatever it is named (engine 0032). No writes.
create function pgflow._trigger_args(flow_slug text, trigger_name text)
returns bytea
language sql
immutable
set search_path = ''
as $$
  select convert_to(flow_slug, 'UTF8') || '\x00'::bytea || convert_to(trigger_name, 'UTF8')
    || '\x00'::bytea;
$$;

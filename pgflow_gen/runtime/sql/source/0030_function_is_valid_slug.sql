-- The slug rule (from engine version 2): whether pgflow._slug_violation finds nothing wrong.
-- Used by the check constraints of flows and steps and by every definition writer.
create function pgflow.is_valid_slug(slug text)
returns boolean
language sql
immutable
set search_path = ''
as $$
  select pgflow._slug_violation(slug) is null
$$;

-- Slug rule of engine version 1 (pgflow's older rule): 1-128 characters, ASCII letters, digits and
-- `_`, not starting with a digit, not the reserved word `run`. Used by check constraints and writers.
create function pgflow.is_valid_slug(slug text)
returns boolean
language sql
immutable
set search_path = ''
as $$
  select slug is not null
    and length(slug) between 1 and 128
    and slug ~ '^[A-Za-z_][A-Za-z0-9_]*$'
    and slug <> 'run'
$$;

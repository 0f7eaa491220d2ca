-- Why a flow or step slug breaks the slug rules, or NULL when it is valid: 1-128 characters,
-- ASCII letters, digits and "_", starting with a letter, not ending with "_", no "__" (reserved as
-- the separator of generated queue names), not the reserved word "run". The texts match
-- pgflow_gen.naming.slug_violation word for word.
create function pgflow._slug_violation(slug text)
returns text
language sql
immutable
set search_path = ''
as $$
  select case
    when slug is null then 'it is missing'
    when slug = '' then 'it is empty'
    when length(slug) > 128 then format('it has %s characters; at most 128 are allowed', length(slug))
    when slug !~ '^[A-Za-z0-9_]+$' then 'only ASCII letters, digits and underscores are allowed'
    when slug !~ '^[A-Za-z]' then 'it must start with a letter'
    when slug ~ '_$' then 'it must not end with an underscore'
    when strpos(slug, '__') > 0 then '"__" is reserved as the separator of generated queue names'
    when slug = 'run' then '"run" is a reserved word'
  end
$$;

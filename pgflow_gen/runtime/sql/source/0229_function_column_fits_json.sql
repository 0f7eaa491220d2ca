-- Whether the values of a column of type column_type, as to_jsonb gives them, can be what the
-- JSON Schema `schema` describes (engine 0032, for table triggers' inputs): by its "type" (a
-- name or a list of names); a schema without one (an enum, anyOf, a $ref), and json and jsonb
-- columns, fit anything. A domain is judged by its base type. No writes.
create function pgflow._column_fits_json(column_type oid, schema jsonb)
returns boolean
language sql
stable
set search_path = ''
as $$
  select case
    when jsonb_typeof(schema) is distinct from 'object' or not schema ? 'type' then true
    when b.typname in ('json', 'jsonb') then true
    else exists (
      select 1
      from jsonb_array_elements_text(case jsonb_typeof(schema -> 'type')
        when 'array' then schema -> 'type' else jsonb_build_array(schema -> 'type') end) as j (name)
      where case j.name
        when 'integer' then b.typname in ('int2', 'int4', 'int8')
        when 'number' then b.typcategory = 'N' and b.typname <> 'money'
        when 'string' then b.typcategory in ('S', 'D', 'E', 'T', 'I', 'V')
          or b.typname in ('uuid', 'money', 'bytea')
        when 'boolean' then b.typcategory = 'B'
        when 'array' then b.typcategory = 'A'
        when 'object' then b.typcategory = 'C'
        else false
      end
    )
  end
  from pg_catalog.pg_type as t
  join pg_catalog.pg_type as b on b.oid = case when t.typtype = 'd' then t.typbasetype else t.oid end
  where t.oid = column_type;
$$;

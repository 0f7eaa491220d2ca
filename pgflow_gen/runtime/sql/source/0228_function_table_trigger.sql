-- The trigger function behind every table trigger of a flow (engine 0032): after a row is
-- inserted or updated (and its `when` held: the database trigger tests it), starts a run of the
-- flow in the writing transaction, its input the trigger's input keys taken from the row's
-- columns. Arguments: the flow's slug and the trigger's name.
-- Runs as the engine's owner, so a role that writes the table need not be a client. So it
-- reads only the mapped columns, and a column of a type PostgreSQL does not ship goes into the
-- input as text (pgflow._builtin_json_type): no code of the table's or a type's owner runs as
-- the engine's owner. It starts only what pgflow.set_flow_triggers recorded for this very table
-- (or, for a partition, its partitioned table), so a copy made by hand on another table starts
-- nothing (only the owner may use the function). A mapped column that is gone is an error
-- (42703), never a null in the input.
-- With on_error raise, a start that fails (an input a root map refuses, a column gone) aborts
-- the write; with skip, the write goes on and pgflow.trigger_skips keeps the start and its
-- error; a deadlock or a serialization failure is raised either way, for the writer to retry.
create function pgflow._table_trigger()
returns trigger
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_trigger pgflow.flow_triggers;
  v_select text;
  v_missing text;
  v_input jsonb;
  v_sqlstate text;
  v_message text;
begin
  select * into v_trigger from pgflow.flow_triggers as t
  where t.flow_slug = tg_argv[0] and t.trigger_name = tg_argv[1]
    and (t.relid = tg_relid
      or t.relid in (select a.relid from pg_catalog.pg_partition_ancestors(tg_relid) as a));
  if not found then
    raise warning 'Trigger % on %.% starts no run: flow "%" has no trigger "%" on this table.',
      tg_name, tg_table_schema, tg_table_name, tg_argv[0], tg_argv[1]
      using hint = 'Apply the flow''s migration again (pgflow-gen db apply), or drop this trigger.';
    return null;
  end if;
  -- One statement builds the input from the mapped columns, as the catalog has them now.
  select 'select jsonb_build_object(' || coalesce(string_agg(format('%L, %s', m.key,
      case when a.attname is null then 'null'
        when pgflow._builtin_json_type(a.atttypid) then format('to_jsonb(($1).%I)', a.attname)
        else format('to_jsonb(format(''%%s'', ($1).%I))', a.attname)
      end), ', ' order by m.key), '') || ')',
    min(m.value) filter (where a.attname is null)
  into v_select, v_missing
  from jsonb_each_text(v_trigger.definition -> 'input') as m
  left join pg_catalog.pg_attribute as a
    on a.attrelid = tg_relid and a.attname = m.value and a.attnum > 0 and not a.attisdropped;

  if v_missing is not null then
    v_message := format('Flow "%s" trigger "%s": table %I.%I has no column %s any more.',
      v_trigger.flow_slug, v_trigger.trigger_name, tg_table_schema, tg_table_name, v_missing);
  end if;
  -- raise: no subtransaction (a bulk write would pay one a row).
  if v_trigger.on_error = 'raise' then
    if v_message is not null then
      raise exception '%', v_message using errcode = '42703',
        hint = 'Map another column in the spec and apply the flow''s migration again.';
    end if;
    execute v_select into v_input using new;
    perform pgflow.start_flow(v_trigger.flow_slug, v_input);
    return null;
  end if;
  begin
    if v_message is not null then
      raise exception '%', v_message using errcode = '42703';
    end if;
    execute v_select into v_input using new;
    perform pgflow.start_flow(v_trigger.flow_slug, v_input);
  exception
    when serialization_failure or deadlock_detected then
      raise;
    when others then
      get stacked diagnostics v_sqlstate = returned_sqlstate, v_message = message_text;
      insert into pgflow.trigger_skips (flow_slug, trigger_name, table_name, operation, input,
        sqlstate, message)
      values (v_trigger.flow_slug, v_trigger.trigger_name, v_trigger.table_name, tg_op, v_input,
        v_sqlstate, v_message);
      raise warning 'Trigger "%" of flow "%" skipped a start: %', v_trigger.trigger_name,
        v_trigger.flow_slug, v_message
        using hint = 'pgflow-gen flows --skips lists the starts skipped, with their input.';
  end;
  return null;
end;
$$;

-- The trigger function behind every table trigger of a flow (engine 0032): after a row is
-- inserted or updated (and its `when` held: the database trigger tests it), starts a run of the
-- flow in the writing transaction, its input the trigger's input keys taken from the row's
-- columns (as to_jsonb gives them). Arguments: the flow's slug and the trigger's name.
-- Runs as the engine's owner, so a role that writes the table need not be a client; it starts
-- only what pgflow.set_flow_triggers recorded for this very table, so a trigger made by hand
-- with these arguments on another table borrows nothing (only the owner may use the function).
-- With on_error raise, a start that fails (the flow deleted, an input a root map refuses) aborts
-- the write; with skip, the write goes on and pgflow.trigger_skips keeps the start and its error.
create function pgflow._table_trigger()
returns trigger
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_trigger pgflow.flow_triggers;
  v_row jsonb := to_jsonb(new);
  v_input jsonb;
  v_sqlstate text;
  v_message text;
begin
  select * into v_trigger from pgflow.flow_triggers as t
  where t.flow_slug = tg_argv[0] and t.trigger_name = tg_argv[1] and t.relid = tg_relid;
  if not found then
    raise warning 'Trigger % on %.% starts no run: flow "%" has no trigger "%" on this table.',
      tg_name, tg_table_schema, tg_table_name, tg_argv[0], tg_argv[1]
      using hint = 'Apply the flow''s migration again (pgflow-gen db apply), or drop this trigger.';
    return null;
  end if;
  select coalesce(jsonb_object_agg(m.key, coalesce(v_row -> (m.value #>> '{}'), 'null')), '{}')
  into v_input
  from jsonb_each(v_trigger.definition -> 'input') as m;

  if v_trigger.on_error = 'raise' then
    perform pgflow.start_flow(v_trigger.flow_slug, v_input);
    return null;
  end if;
  begin
    perform pgflow.start_flow(v_trigger.flow_slug, v_input);
  exception when others then
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

-- Creates the database trigger of a checked table trigger (pgflow._checked_trigger) and keeps its
-- row (engine 0032): after insert or update (as the trigger's "on" says) of each row, when its
-- condition holds, pgflow._table_trigger starts the run. A `when` value the column's type cannot
-- read (a word for a number) is refused here, with the flow, the trigger and PostgreSQL's reason.
create function pgflow._create_table_trigger(trigger pgflow.flow_triggers)
returns void
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_sqlstate text;
  v_message text;
begin
  begin
    execute format('create trigger %I after %s on %s for each row %s execute function pgflow._table_trigger(%L, %L)',
      trigger.pg_trigger_name,
      (select string_agg(e, ' or ' order by e) from jsonb_array_elements_text(trigger.definition -> 'on') as e),
      trigger.relid::regclass,
      case when trigger.condition is not null then format('when (%s)', trigger.condition) else '' end,
      trigger.flow_slug, trigger.trigger_name);
  exception when others then
    get stacked diagnostics v_sqlstate = returned_sqlstate, v_message = message_text;
    raise exception 'Flow "%" trigger "%": table % cannot take it: %', trigger.flow_slug,
      trigger.trigger_name, trigger.relid::regclass, v_message
      using errcode = v_sqlstate,
        hint = case
          when v_sqlstate = '42710' then 'The table has a trigger of that name already: drop or rename it.'
          when v_sqlstate = '42501' then format('The engine''s owner creates the trigger: grant trigger on %s to %I.',
            trigger.relid::regclass, current_user)
          else 'Check the values in "when" against the columns'' types.' end;
  end;
  insert into pgflow.flow_triggers (flow_slug, trigger_name, table_name, relid, pg_trigger_name,
    definition, condition, on_error)
  values (trigger.flow_slug, trigger.trigger_name, trigger.table_name, trigger.relid,
    trigger.pg_trigger_name, trigger.definition, trigger.condition, trigger.on_error);
end;
$$;

-- Engine migration 0032: table triggers.
-- A flow's spec may list table triggers: a write to an application table starts a run of the
-- flow in the writing transaction, its input mapped from the row's columns. The flow's generated
-- migration calls pgflow.set_flow_triggers, which checks each trigger against the table and the
-- flow's input schema and keeps pgflow.flow_triggers and the database triggers in step; the one
-- trigger function, pgflow._table_trigger, runs as the engine's owner. Starts a trigger with
-- on_error skip could not make are kept in pgflow.trigger_skips. Deleting a flow drops its
-- triggers; a local recompile keeps them.

-- BEGIN HAND-WRITTEN: tables and data, applied before the functions below.
-- The table triggers of a flow (engine 0032): a write to an application table starts a run of
-- the flow in the writing transaction. One row per trigger of the flow's spec, kept in step with
-- the spec by pgflow.set_flow_triggers (which the flow's generated migration calls); the
-- database trigger it created (pg_trigger_name on relid) calls pgflow._table_trigger, which
-- reads this row. Not tied to pgflow.flows by a foreign key: pgflow.delete_flow_and_data drops a
-- flow's database triggers with these rows, and a cascade would leave the triggers behind.
create table pgflow.flow_triggers (
  flow_slug text not null,
  -- The spec's name of the trigger, unique in its flow.
  trigger_name text not null,
  -- The table as applied (schema-qualified), its oid, and the database trigger's name on it.
  table_name text not null,
  relid oid not null,
  pg_trigger_name text not null,
  -- What set_flow_triggers was given for it ({"table", "on", "when", "input", "onError"}, with
  -- the defaults filled in), to compare with the next definition, and its `when` as the
  -- database trigger tests it (SQL on new and old; null: always).
  definition jsonb not null,
  condition text,
  -- raise: a start that fails aborts the write; skip: it is logged in pgflow.trigger_skips.
  on_error text not null,
  applied_at timestamptz not null default clock_timestamp(),
  primary key (flow_slug, trigger_name),
  constraint on_error_is_known check (on_error in ('raise', 'skip'))
);
-- Starts a table trigger with `on_error: skip` could not make (engine 0032): the application's
-- write went on, and the run it should have started is here, with the input it would have had
-- and the error, for `pgflow-gen flows --skips` and for starting it by hand. Pruned with the
-- runs (pgflow.prune_data_older_than).
create table pgflow.trigger_skips (
  skip_id bigint generated always as identity primary key,
  flow_slug text not null,
  trigger_name text not null,
  table_name text not null,
  -- INSERT or UPDATE: the write that fired the trigger.
  operation text not null,
  input jsonb,
  sqlstate text not null,
  message text not null,
  skipped_at timestamptz not null default clock_timestamp()
);
create index trigger_skips_skipped_at on pgflow.trigger_skips (skipped_at);
-- END HAND-WRITTEN

-- Written by `make migration` from pgflow_gen/runtime/sql/source/: edit the source, then
-- write the migration again; only the header and the hand-written section above are kept.

-- pgflow.delete_flow_and_data: source/0117_function_delete_flow_and_data.sql
create or replace function pgflow.delete_flow_and_data(flow_slug text)
returns void
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_queues text[];
  v_queue text;
  v_active_queues text[];
  v_active_messages bigint[];
  v_mode text;
  v_listed text[];
  v_bound text;
  v_user record;
  v_child record;
begin
  perform pgflow._lock_flow_definition(flow_slug);
  select f.queue_mode into v_mode from pgflow.flows as f where f.flow_slug = delete_flow_and_data.flow_slug;
  if not found then
    return;
  end if;
  -- GUARD: a flow another flow starts as a subflow stays (engine 0028): deleting it would leave
  -- that flow's subflow tasks waiting for runs that are gone.
  select s.flow_slug, s.step_slug into v_user from pgflow.steps as s
  where s.subflow_slug = delete_flow_and_data.flow_slug and s.flow_slug <> delete_flow_and_data.flow_slug
  order by s.flow_slug, s.step_index
  limit 1;
  if found then
    raise exception 'Flow "%" is the subflow of step "%" of flow "%", so it cannot be deleted.',
      flow_slug, v_user.step_slug, v_user.flow_slug
      using errcode = '55000', hint = format('Nothing was deleted. Delete flow "%s" first.', v_user.flow_slug);
  end if;

  v_queues := array(
    select s.queue_name from pgflow.steps as s where s.flow_slug = delete_flow_and_data.flow_slug
    union
    select pgflow.default_queue_name(delete_flow_and_data.flow_slug) where v_mode = 'flow'
  );

  -- Same lock order as the task callbacks: runs first (in key order), then their rows.
  perform 1 from pgflow.runs as r
  where r.flow_slug = delete_flow_and_data.flow_slug
  order by r.run_id
  for update;

  -- The subflow runs its runs started (engine 0028) lose their parent, and the ones still
  -- running are cancelled: their flow stays, their parents go.
  for v_child in
    update pgflow.runs as c set parent_run_id = null, parent_step_slug = null, parent_task_index = null
    where c.parent_run_id in (select r.run_id from pgflow.runs as r where r.flow_slug = delete_flow_and_data.flow_slug)
      and c.flow_slug <> delete_flow_and_data.flow_slug
    returning c.run_id, c.status
  loop
    if v_child.status = 'started' then
      perform pgflow._cancel_run(v_child.run_id,
        format('Its parent run was deleted with flow "%s".', delete_flow_and_data.flow_slug));
    end if;
  end loop;

  -- Messages of unfinished tasks go too (their task rows locked first, in key order, as claims
  -- do): a queue shared with another flow survives this deletion.
  with active as (
    select t.queue_name, t.message_id from pgflow.step_tasks as t
    where t.flow_slug = delete_flow_and_data.flow_slug and t.status in ('queued', 'started')
    order by t.run_id, t.step_slug, t.task_index
    for update
  )
  select array_agg(a.queue_name), array_agg(a.message_id) into v_active_queues, v_active_messages
  from active as a;
  perform pgflow._archive_task_messages(v_active_queues, v_active_messages);

  foreach v_queue in array v_queues loop
    perform pgflow.archive_completed_messages(v_queue);
  end loop;
  delete from pgflow.step_tasks as t where t.flow_slug = delete_flow_and_data.flow_slug;
  delete from pgflow.step_states as s where s.flow_slug = delete_flow_and_data.flow_slug;
  delete from pgflow.runs as r where r.flow_slug = delete_flow_and_data.flow_slug;
  delete from pgflow.deps as d where d.flow_slug = delete_flow_and_data.flow_slug;
  delete from pgflow.steps as s where s.flow_slug = delete_flow_and_data.flow_slug;
  delete from pgflow.flows as f where f.flow_slug = delete_flow_and_data.flow_slug;
  -- Its table triggers go too (engine 0032): writes to their tables start nothing any more.
  perform pgflow._drop_flow_triggers(flow_slug);
  select string_agg(r.role_name, ', ' order by r.role_name) into v_bound
  from pgflow.step_roles as r where r.flow_slug = delete_flow_and_data.flow_slug;
  if v_bound is not null then
    raise notice 'Step roles of flow "%" stay bound to their steps: %.', flow_slug, v_bound
      using detail = 'They work on nothing until the flow is applied again with those steps, and never as plain workers.',
        hint = '`pgflow-gen db roles` lists step roles whose step does not exist; drop those no longer needed.';
  end if;

  foreach v_queue in array v_queues loop
    continue when exists (select 1 from pgflow.steps as s where s.queue_name = v_queue)
      or exists (select 1 from pgflow.flows as f where f.queue_mode = 'flow' and pgflow.default_queue_name(f.flow_slug) = v_queue);
    v_listed := array(select q.queue_name from pgmq.list_queues() as q where lower(q.queue_name) = v_queue);
    if cardinality(v_listed) > 1 then
      -- PGMQ names a queue's tables in lowercase: these spellings are one physical queue.
      raise exception 'The queue "%" of flow "%" is ambiguous.', v_queue, flow_slug
        using errcode = '42710',
          detail = format('PGMQ lists %s for the same tables; nothing was deleted.', array_to_string(v_listed, ', ')),
          hint = 'Remove the extra rows from pgmq.meta (never pgmq.drop_queue, which drops the shared tables), then delete again.';
    end if;
    if cardinality(v_listed) = 1 then
      perform pgmq.drop_queue(v_listed[1]);
    end if;
    delete from pgflow.archivable_messages as m where m.queue_name = v_queue;
  end loop;
end;
$$;

-- pgflow.ensure_flow_compiled: source/0118_function_ensure_flow_compiled.sql
create or replace function pgflow.ensure_flow_compiled(
  flow_slug text,
  shape jsonb,
  queue_mode text default 'flow',
  route_map jsonb default null
)
returns jsonb
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_queues text[];
  v_derived jsonb;
  v_twin text;
  v_differences text[];
  v_kind text;
  v_description jsonb;
  v_options jsonb;
  v_deleted_runs bigint;
  v_triggers jsonb;
begin
  select c.queues, c.derived into v_queues, v_derived
  from pgflow._check_flow_definition(flow_slug, shape, queue_mode, route_map) as c;

  perform pgflow._lock_flow_definition(flow_slug);

  select f.flow_slug into v_twin from pgflow.flows as f
  where lower(f.flow_slug) = lower(ensure_flow_compiled.flow_slug) and f.flow_slug <> ensure_flow_compiled.flow_slug;
  if v_twin is not null then
    raise exception 'Flow "%" differs only in case from the existing flow "%".', flow_slug, v_twin
      using errcode = '23505', detail = 'Flow slugs are unique ignoring case.',
        hint = 'Use the existing spelling, or a different flow slug.';
  end if;

  if not exists (select 1 from pgflow.flows as f where f.flow_slug = ensure_flow_compiled.flow_slug) then
    perform pgflow._create_flow_from_shape(flow_slug, shape, queue_mode, v_queues);
    perform pgflow._adopt_flow_description(flow_slug, shape);
    return jsonb_build_object('status', 'compiled', 'mismatchKind', null, 'differences', '[]'::jsonb);
  end if;

  select d.kind, d.differences into v_kind, v_differences
  from pgflow._flow_differences(flow_slug, shape, queue_mode, v_derived) as d;
  if v_kind is null then
    v_description := pgflow._adopt_flow_description(flow_slug, shape);
    if (v_description ->> 'kept')::boolean then
      return jsonb_build_object('status', 'verified', 'mismatchKind', null, 'differences', '[]'::jsonb,
        'descriptionKept', true,
        'summary', format('verified; kept the options and input schema adopted at %s: this description of the flow is an older one',
          date_trunc('second', (v_description ->> 'adoptedAt')::timestamptz)));
    end if;
    v_options := v_description -> 'optionsUpdated';
    if jsonb_array_length(v_options) = 0 then
      return jsonb_build_object('status', 'verified', 'mismatchKind', null, 'differences', '[]'::jsonb);
    end if;
    return jsonb_build_object('status', 'verified', 'mismatchKind', null, 'differences', '[]'::jsonb,
      'optionsUpdated', v_options,
      'summary', 'verified; options updated: ' || (
        select string_agg(format('%s %s %s -> %s%s',
            case when c ->> 'step' is null then 'flow' else format('step "%s"', c ->> 'step') end,
            c ->> 'option', coalesce(c ->> 'from', n.unset), coalesce(c ->> 'to', n.unset),
            case when c ? 'override' then format(' (an operator''s %s stays until `pgflow-gen limits %s %s --reset`)',
              coalesce(c ->> 'override', 'none'), flow_slug, c ->> 'step') else '' end),
          ', ' order by o)
        from jsonb_array_elements(v_options) with ordinality as x (c, o),
          -- An unset option is the flow's; an unset limit or key is none.
          lateral (select case when c ->> 'step' is not null and c ->> 'option' in ('maxInFlight',
            'rateLimit', 'ratePeriod', 'concurrencyKey', 'concurrencyLimit') then 'none'
            else 'the flow''s' end) as n (unset)
      ));
  end if;

  if coalesce(current_setting('pgflow.local', true), '') = 'on' then
    -- The new queues must be free before the old definition goes (its own queues count as free).
    perform pgflow._preflight_queue_names(flow_slug,
      case when queue_mode = 'flow' then array[pgflow.default_queue_name(flow_slug)] else v_queues end);
    select count(*) into v_deleted_runs from pgflow.runs as r where r.flow_slug = ensure_flow_compiled.flow_slug;
    -- The flow's table triggers stay through the recompile (engine 0032): their rows are set
    -- aside, so that deleting the flow leaves its database triggers, then put back.
    with gone as (
      delete from pgflow.flow_triggers as t where t.flow_slug = ensure_flow_compiled.flow_slug
      returning to_jsonb(t) as t
    )
    select jsonb_agg(g.t) into v_triggers from gone as g;
    perform pgflow.delete_flow_and_data(flow_slug);
    perform pgflow._create_flow_from_shape(flow_slug, shape, queue_mode, v_queues);
    insert into pgflow.flow_triggers
    select * from jsonb_populate_recordset(null::pgflow.flow_triggers, v_triggers);
    perform pgflow._adopt_flow_description(flow_slug, shape);
    return jsonb_build_object('status', 'recompiled', 'mismatchKind', v_kind,
      'differences', to_jsonb(v_differences), 'deletedRuns', v_deleted_runs,
      'summary', format('recompiled: %s %s deleted', v_deleted_runs,
        case when v_deleted_runs = 1 then 'run' else 'runs' end));
  end if;
  return jsonb_build_object('status', 'mismatch', 'mismatchKind', v_kind,
    'differences', to_jsonb(v_differences));
end;
$$;

-- pgflow.prune_data_older_than: source/0151_function_prune_data_older_than.sql
create or replace function pgflow.prune_data_older_than(retention interval, batch_size int default null)
returns jsonb
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_cutoff timestamptz := now() - retention;
  v_runs uuid[];
  v_queue text;
  v_workers int;
  v_archived int := 0;
  v_count int;
  v_queues text[];
  v_messages bigint[];
  v_done boolean := true;
  v_top_runs int;
begin
  if retention is null or retention < interval '0' then
    raise exception 'Retention must be a non-negative interval, got %.', retention using errcode = '22023';
  end if;
  if batch_size < 1 then
    raise exception 'The batch size must be at least 1, got %.', batch_size
      using errcode = '22023', hint = 'Pass null to prune everything in one call.';
  end if;

  perform pgflow.archive_completed_messages();

  -- Same lock order as the task callbacks: runs first; a run busy right now is pruned next time.
  -- In no particular order: sorting every finished run to take a batch would cost more than
  -- deleting it, and skip locked never waits, so the order of these locks cannot deadlock.
  -- A subflow run goes with its top run (engine 0028), never alone.
  v_runs := array(
    select r.run_id from pgflow.runs as r
    where ((r.status = 'completed' and r.completed_at < v_cutoff)
       or (r.status = 'failed' and r.failed_at < v_cutoff)
       or (r.status = 'cancelled' and r.cancelled_at < v_cutoff))
      and r.parent_run_id is null
    limit batch_size
    for update skip locked
  );
  if cardinality(v_runs) = batch_size then
    v_done := false;
  end if;
  if cardinality(v_runs) = 0 then
    v_runs := null;
  end if;
  v_top_runs := coalesce(cardinality(v_runs), 0);
  -- Their subflow runs, however deep (all finished with them: a finished run ended its children).
  if v_runs is not null and exists (
    select 1 from pgflow.runs as c where c.parent_run_id = any (v_runs)
  ) then
    v_runs := v_runs || array(
      with recursive down (run_id) as (
        select c.run_id from pgflow.runs as c where c.parent_run_id = any (v_runs)
        union all
        select c.run_id from down as d join pgflow.runs as c on c.parent_run_id = d.run_id
      )
      select d.run_id from down as d
      join pgflow.runs as r on r.run_id = d.run_id
      order by d.run_id
      for update of r
    );
  end if;

  if v_runs is not null then
    -- The tasks' messages still in their queues go with them, or they would come back after every
    -- lease with no task to claim (a run failed by hand, a task parked by stall recovery).
    with gone as (
      delete from pgflow.step_tasks as t where t.run_id = any (v_runs)
      returning t.queue_name, t.message_id
    )
    select array_agg(g.queue_name), array_agg(g.message_id) into v_queues, v_messages
    from gone as g where g.message_id is not null;
    for v_queue in select distinct q from unnest(v_queues) as q loop
      continue when to_regclass(format('pgmq.%I', pgflow.pgmq_table_name(v_queue))) is null;
      perform pgmq.delete(v_queue, array(
        select x.m from unnest(v_queues, v_messages) as x (q, m) where x.q = v_queue
      ));
    end loop;
    delete from pgflow.step_states as ss where ss.run_id = any (v_runs);
    delete from pgflow.operator_actions as a where a.run_id = any (v_runs);
    delete from pgflow.runs as r where r.run_id = any (v_runs);
  end if;
  -- Actions on a step rather than a run (a pause, a resume) go with age.
  delete from pgflow.operator_actions as a where a.run_id is null and a.acted_at < v_cutoff;
  -- The starts table triggers skipped (engine 0032), with age too.
  delete from pgflow.trigger_skips as k where k.skipped_at < v_cutoff;

  delete from pgflow.workers as w where w.last_heartbeat_at < v_cutoff;
  get diagnostics v_workers = row_count;

  for v_queue in
    select s.queue_name from pgflow.steps as s
    union
    select pgflow.default_queue_name(f.flow_slug) from pgflow.flows as f where f.queue_mode = 'flow'
  loop
    continue when to_regclass(format('pgmq.%I', pgflow.pgmq_table_name(v_queue, 'a'))) is null;
    execute format(
      'delete from pgmq.%1$I where msg_id in'
      ' (select a.msg_id from pgmq.%1$I as a where a.archived_at < $1 limit $2)',
      pgflow.pgmq_table_name(v_queue, 'a'))
      using v_cutoff, batch_size;
    get diagnostics v_count = row_count;
    v_archived := v_archived + v_count;
    if v_count = batch_size then
      v_done := false;
    end if;
  end loop;

  return jsonb_build_object(
    'runs', v_top_runs, 'subflow_runs', coalesce(cardinality(v_runs), 0) - v_top_runs, 'workers', v_workers, 'archived_messages', v_archived,
    'done', v_done
  );
end;
$$;

-- pgflow._table_trigger: source/0228_function_table_trigger.sql
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

-- pgflow._column_fits_json: source/0229_function_column_fits_json.sql
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

-- pgflow._checked_trigger: source/0230_function_checked_trigger.sql
create function pgflow._checked_trigger(flow_slug text, trigger jsonb, input_schema jsonb)
returns pgflow.flow_triggers
language plpgsql
stable
set search_path = ''
as $$
declare
  v_row pgflow.flow_triggers;
  v_where text;
  v_key text;
  v_relid oid;
  v_events jsonb := coalesce(trigger -> 'on', '["insert"]');
  v_when jsonb := coalesce(trigger -> 'when', '{}');
  v_on_error text := coalesce(trigger ->> 'onError', 'raise');
  v_item record;
  v_test record;
  v_type oid;
  v_tests text[] := '{}';
  v_operator text;
  v_owner text;
  v_parts int;
begin
  if jsonb_typeof(trigger) is distinct from 'object' then
    raise exception 'Flow "%": each of its triggers must be a JSON object, got %.', flow_slug,
      coalesce(jsonb_typeof(trigger), 'NULL') using errcode = '22023';
  end if;
  if coalesce(trigger ->> 'name', '') !~ '^[A-Za-z][A-Za-z0-9_]{0,39}$' then
    raise exception 'Flow "%": a trigger''s name must be a letter, then letters, digits or _ (at most 40 in all), got %.',
      flow_slug, coalesce((trigger -> 'name')::text, 'none') using errcode = '22023';
  end if;
  v_where := format('Flow "%s" trigger "%s"', flow_slug, trigger ->> 'name');
  select k into v_key from jsonb_object_keys(trigger) as k
  where k not in ('name', 'table', 'on', 'when', 'input', 'onError') order by k limit 1;
  if found then
    raise exception '%: unknown key "%".', v_where, v_key
      using errcode = '22023', hint = 'A trigger has name, table, on, when, input and onError.';
  end if;

  -- table: an existing table (schema-qualified: this runs with an empty search path), which
  -- the caller may put triggers on and the engine's owner may drop them from.
  if jsonb_typeof(trigger -> 'table') is distinct from 'string' then
    raise exception '%: "table" must name a table, got %.', v_where,
      coalesce((trigger -> 'table')::text, 'nothing') using errcode = '22023';
  end if;
  begin
    v_parts := cardinality(pg_catalog.parse_ident(trigger ->> 'table'));
  exception when invalid_name or syntax_error or invalid_parameter_value then
    v_parts := null;
  end;
  if v_parts is distinct from 2 then
    raise exception '%: table % must be given as schema.table.', v_where, trigger ->> 'table'
      using errcode = '22023';
  end if;
  v_relid := to_regclass(trigger ->> 'table');
  if v_relid is null or not exists (
    select 1 from pg_catalog.pg_class as c where c.oid = v_relid and c.relkind in ('r', 'p')
  ) then
    raise exception '%: table % does not exist.', v_where, trigger ->> 'table'
      using errcode = '42P01',
        hint = 'Create the table before applying the flow''s migration, or fix `table:` in the spec (schema.table; a view cannot have one).';
  end if;
  if not pg_catalog.has_table_privilege(session_user, v_relid, 'TRIGGER') then
    raise exception '%: role % may not put triggers on table %.', v_where, session_user, v_relid::regclass
      using errcode = '42501',
        hint = format('The role applying the migration needs the TRIGGER privilege: grant trigger on %s to %I.', v_relid::regclass, session_user);
  end if;
  select pg_catalog.pg_get_userbyid(c.relowner) into v_owner
  from pg_catalog.pg_class as c
  where c.oid = v_relid and not pg_catalog.pg_has_role(current_user, c.relowner, 'MEMBER');
  if found then
    raise exception '%: the engine''s owner, %, neither owns table % nor is a member of its owner, %, so it could not drop the trigger again.',
      v_where, current_user, v_relid::regclass, v_owner
      using errcode = '42501',
        hint = format('Make it a member of the table''s owner (grant %I to %I), or give it the table.', v_owner, current_user);
  end if;

  -- on: insert, update or both.
  if jsonb_typeof(v_events) is distinct from 'array' or jsonb_array_length(v_events) = 0
    or exists (select 1 from jsonb_array_elements(v_events) as e where e not in ('"insert"', '"update"'))
    or (select count(distinct e) <> count(*) from jsonb_array_elements(v_events) as e)
  then
    raise exception '%: "on" must list insert, update or both, got %.', v_where, v_events::text
      using errcode = '22023';
  end if;
  v_events := (select jsonb_agg(e order by e) from jsonb_array_elements(v_events) as e);
  if v_on_error not in ('raise', 'skip') then
    raise exception '%: "onError" must be raise or skip, got %.', v_where, trigger -> 'onError'
      using errcode = '22023';
  end if;

  -- input: {input key: column}, the flow's input schema satisfied.
  if jsonb_typeof(input_schema -> 'type') = 'string' and input_schema ->> 'type' <> 'object' then
    raise exception '%: a trigger starts runs with an object of columns, but the flow''s input is a %.',
      v_where, input_schema ->> 'type' using errcode = '42804';
  end if;
  if jsonb_typeof(trigger -> 'input') is distinct from 'object' then
    raise exception '%: "input" must map input keys to columns, got %.', v_where,
      coalesce((trigger -> 'input')::text, 'nothing') using errcode = '22023';
  end if;
  for v_item in select i.key, i.value from jsonb_each(trigger -> 'input') as i order by i.key loop
    if jsonb_typeof(v_item.value) <> 'string' then
      raise exception '%: input "%" must name a column, got %.', v_where, v_item.key, v_item.value
        using errcode = '22023';
    end if;
    v_type := pgflow._column_type(v_relid, v_item.value #>> '{}');
    if v_type is null then
      raise exception '%: input "%" takes column %, which table % does not have.', v_where,
        v_item.key, v_item.value #>> '{}', v_relid::regclass
        using errcode = '42703', hint = 'Column names are case-sensitive, as the catalog spells them.';
    end if;
    if not pgflow._column_fits_json(v_type, input_schema -> 'properties' -> v_item.key) then
      raise exception '%: input "%" takes column % of %, a %, but the flow''s input schema says %.',
        v_where, v_item.key, v_item.value #>> '{}', v_relid::regclass, pg_catalog.format_type(v_type, null),
        input_schema -> 'properties' -> v_item.key -> 'type'
        using errcode = '42804',
          hint = 'Map a column whose values (as to_jsonb gives them) are of that JSON type, or change the flow''s input schema.';
    end if;
  end loop;
  select k into v_key
  from jsonb_array_elements_text(case when jsonb_typeof(input_schema -> 'required') = 'array'
    then input_schema -> 'required' else '[]' end) as k
  where not (trigger -> 'input') ? k
  order by k limit 1;
  if found then
    raise exception '%: the flow''s input requires key "%", which "input" does not map.', v_where, v_key
      using errcode = '22023';
  end if;

  -- when: {column: {operator: value}}, as SQL the database trigger tests.
  if jsonb_typeof(v_when) <> 'object' then
    raise exception '%: "when" must map columns to tests, got %.', v_where, v_when
      using errcode = '22023';
  end if;
  for v_item in select w.key, w.value from jsonb_each(v_when) as w order by w.key loop
    if pgflow._column_type(v_relid, v_item.key) is null then
      raise exception '%: "when" tests column %, which table % does not have.', v_where, v_item.key,
        v_relid::regclass using errcode = '42703';
    end if;
    if jsonb_typeof(v_item.value) <> 'object' or v_item.value = '{}' then
      raise exception '%: "when" must give column % tests as {operator: value}, got %.', v_where,
        v_item.key, v_item.value using errcode = '22023';
    end if;
    for v_test in select t.key, t.value from jsonb_each(v_item.value) as t order by t.key loop
      v_operator := case v_test.key when 'eq' then '=' when 'ne' then '<>' when 'gt' then '>'
        when 'gte' then '>=' when 'lt' then '<' when 'lte' then '<=' end;
      if v_operator is not null and jsonb_typeof(v_test.value) in ('string', 'number', 'boolean') then
        v_tests := v_tests || format('new.%I %s %L', v_item.key, v_operator, v_test.value #>> '{}');
      elsif v_test.key = 'in' and jsonb_typeof(v_test.value) = 'array'
        and jsonb_array_length(v_test.value) > 0
        and not exists (select 1 from jsonb_array_elements(v_test.value) as x
          where jsonb_typeof(x) not in ('string', 'number', 'boolean'))
      then
        v_tests := v_tests || format('new.%I in (%s)', v_item.key,
          (select string_agg(format('%L', x #>> '{}'), ', ') from jsonb_array_elements(v_test.value) as x));
      elsif v_test.key = 'is_null' and jsonb_typeof(v_test.value) = 'boolean' then
        v_tests := v_tests || format('new.%I is %snull', v_item.key,
          case when v_test.value = 'true' then '' else 'not ' end);
      elsif v_test.key = 'changed' and jsonb_typeof(v_test.value) = 'boolean' then
        if v_events <> '["update"]' then
          raise exception '%: "when" tests whether column % changed, which only an update can say.',
            v_where, v_item.key using errcode = '22023', hint = 'Give the trigger on: [update] alone.';
        end if;
        v_tests := v_tests || format('old.%I is %sdistinct from new.%I', v_item.key,
          case when v_test.value = 'true' then '' else 'not ' end, v_item.key);
      else
        raise exception '%: "when" cannot test column % with % %.', v_where, v_item.key, v_test.key,
          v_test.value
          using errcode = '22023',
            hint = 'Tests: eq, ne, gt, gte, lt, lte (a scalar), in (a list of scalars), is_null and changed (true or false).';
      end if;
    end loop;
  end loop;

  v_row.flow_slug := flow_slug;
  v_row.trigger_name := trigger ->> 'name';
  v_row.table_name := v_relid::regclass::text;
  v_row.relid := v_relid;
  -- pgflow_<flow>__<name>: a flow slug holds no "__" and ends with no "_", so no two flows'
  -- triggers share a name; hashed when longer than PostgreSQL's 63 bytes.
  v_row.pg_trigger_name := case
    when octet_length(format('pgflow_%s__%s', flow_slug, trigger ->> 'name')) <= 63
    then format('pgflow_%s__%s', flow_slug, trigger ->> 'name')
    else 'pgflow_' || left(md5(flow_slug || '/' || (trigger ->> 'name')), 24)
  end;
  v_row.definition := jsonb_build_object('table', trigger -> 'table', 'on', v_events,
    'when', v_when, 'input', trigger -> 'input', 'onError', v_on_error);
  v_row.condition := nullif(array_to_string(v_tests, ' and '), '');
  v_row.on_error := v_on_error;
  return v_row;
end;
$$;

-- pgflow._column_type: source/0231_function_column_type.sql
create function pgflow._column_type(relid oid, column_name text)
returns oid
language sql
stable
set search_path = ''
as $$
  select a.atttypid from pg_catalog.pg_attribute as a
  where a.attrelid = relid and a.attname = column_name and a.attnum > 0 and not a.attisdropped;
$$;

-- pgflow._create_table_trigger: source/0232_function_create_table_trigger.sql
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

-- pgflow._drop_flow_triggers: source/0233_function_drop_flow_triggers.sql
create function pgflow._drop_flow_triggers(flow_slug text, keep text[] default '{}')
returns text[]
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_trigger pgflow.flow_triggers;
  v_name name;
  v_dropped text[] := '{}';
begin
  for v_trigger in
    delete from pgflow.flow_triggers as t
    where t.flow_slug = _drop_flow_triggers.flow_slug and t.trigger_name <> all (keep)
    returning *
  loop
    for v_name in
      select g.tgname from pg_catalog.pg_trigger as g
      where g.tgrelid = v_trigger.relid and g.tgfoid = 'pgflow._table_trigger'::regproc
        and g.tgparentid = 0
        and g.tgargs = pgflow._trigger_args(v_trigger.flow_slug, v_trigger.trigger_name)
    loop
      execute format('drop trigger %I on %s', v_name, v_trigger.relid::regclass);
    end loop;
    v_dropped := v_dropped || v_trigger.trigger_name;
  end loop;
  return (select coalesce(array_agg(d order by d), '{}') from unnest(v_dropped) as d);
end;
$$;

-- pgflow.set_flow_triggers: source/0234_function_set_flow_triggers.sql
create function pgflow.set_flow_triggers(flow_slug text, triggers jsonb)
returns jsonb
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_schema jsonb;
  v_wanted pgflow.flow_triggers[] := '{}';
  v_trigger pgflow.flow_triggers;
  v_item jsonb;
  v_kept text[];
  v_dropped text[];
  v_created text[] := '{}';
  v_replaced text[];
begin
  perform pgflow._lock_flow_definition(flow_slug);
  select f.input_schema into v_schema from pgflow.flows as f
  where f.flow_slug = set_flow_triggers.flow_slug;
  if not found then
    raise exception 'Flow "%" does not exist.', flow_slug
      using errcode = 'P0002', hint = 'Compile the flow before setting its triggers.';
  end if;
  if jsonb_typeof(triggers) is distinct from 'array' then
    raise exception 'Flow "%": its triggers must be a JSON array, got %.', flow_slug,
      coalesce(jsonb_typeof(triggers), 'NULL') using errcode = '22023';
  end if;
  for v_item in select t from jsonb_array_elements(triggers) as t loop
    v_trigger := pgflow._checked_trigger(flow_slug, v_item, v_schema);
    if exists (select 1 from unnest(v_wanted) as w where w.trigger_name = v_trigger.trigger_name) then
      raise exception 'Flow "%" has two triggers named "%".', flow_slug, v_trigger.trigger_name
        using errcode = '22023', hint = 'Give each trigger of a flow its own name.';
    end if;
    v_wanted := v_wanted || v_trigger;
  end loop;

  -- Kept: the same definition on the same table, its database trigger still there (found by
  -- its function and arguments: a trigger renamed by hand is still the one).
  v_kept := array(
    select t.trigger_name from pgflow.flow_triggers as t
    join unnest(v_wanted) as w on w.trigger_name = t.trigger_name and w.relid = t.relid
      and w.definition = t.definition
    where t.flow_slug = set_flow_triggers.flow_slug
      and exists (select 1 from pg_catalog.pg_trigger as g
        where g.tgrelid = t.relid and g.tgfoid = 'pgflow._table_trigger'::regproc
          and g.tgparentid = 0
          and g.tgargs = pgflow._trigger_args(t.flow_slug, t.trigger_name))
    order by t.trigger_name
  );
  v_dropped := pgflow._drop_flow_triggers(flow_slug, v_kept);
  foreach v_trigger in array v_wanted loop
    continue when v_trigger.trigger_name = any (v_kept);
    perform pgflow._create_table_trigger(v_trigger);
    v_created := v_created || v_trigger.trigger_name;
  end loop;
  v_replaced := array(select c from unnest(v_created) as c where c = any (v_dropped) order by c);
  v_created := array(select c from unnest(v_created) as c where c <> all (v_replaced) order by c);
  v_dropped := array(select d from unnest(v_dropped) as d where d <> all (v_replaced) order by d);
  return jsonb_build_object('created', to_jsonb(v_created), 'dropped', to_jsonb(v_dropped),
    'replaced', to_jsonb(v_replaced), 'kept', to_jsonb(v_kept),
    'summary', nullif(concat_ws('; ',
      'triggers created: ' || nullif(array_to_string(v_created, ', '), ''),
      'triggers replaced: ' || nullif(array_to_string(v_replaced, ', '), ''),
      'triggers dropped: ' || nullif(array_to_string(v_dropped, ', '), '')), ''));
end;
$$;

-- pgflow._builtin_json_type: source/0235_function_builtin_json_type.sql
create function pgflow._builtin_json_type(type_oid oid)
returns boolean
language sql
stable
set search_path = ''
as $$
  with recursive under (oid, depth) as (
    select type_oid, 0
    union all
    select case when t.typtype = 'd' then t.typbasetype else t.typelem end, u.depth + 1
    from under as u
    join pg_catalog.pg_type as t on t.oid = u.oid
    where (t.typtype = 'd' or (t.typcategory = 'A' and t.typelem <> 0)) and u.depth < 32
  )
  select coalesce(bool_and(u.oid < 16384), false)
  from under as u
  join pg_catalog.pg_type as t on t.oid = u.oid
  where not (t.typtype = 'd' or (t.typcategory = 'A' and t.typelem <> 0));
$$;

-- pgflow._trigger_args: source/0236_function_trigger_args.sql
create function pgflow._trigger_args(flow_slug text, trigger_name text)
returns bytea
language sql
immutable
set search_path = ''
as $$
  select convert_to(flow_slug, 'UTF8') || '\x00'::bytea || convert_to(trigger_name, 'UTF8')
    || '\x00'::bytea;
$$;
-- No engine function runs for PUBLIC (engine 0019), those above included.
revoke execute on all functions in schema pgflow from public;

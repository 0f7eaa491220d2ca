-- Delivers a signal to a signal step of a started run: the payload, checked against the step's
-- payload schema, becomes the step's output. A waiting step completes at once and the run moves
-- on; a step that is not ready yet keeps the signal until it is. Returns the signal's row (used_at
-- set when its step took it now, null while it waits for its step); one event, signal:received.
-- Refused, changing nothing: an unknown run or step (P0002), a step that is not a signal step or
-- a payload that does not match (22023), a run that is not started, a step that finished or
-- whose wait ran out (55000), a second signal for the step (23505).
-- Locks the run, then the step state, as every callback does.
create function pgflow.send_signal(run_id uuid, step_slug text, payload jsonb)
returns pgflow.signals
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_run pgflow.runs;
  v_step pgflow.steps;
  v_state pgflow.step_states;
  v_signal pgflow.signals;
  v_signal_steps text;
  v_problem text;
begin
  select * into v_run from pgflow.runs as r where r.run_id = send_signal.run_id for update;
  if not found then
    raise exception 'Run % does not exist.', run_id using errcode = 'P0002';
  end if;
  select string_agg(format('"%s"', s.step_slug), ', ' order by s.step_index) into v_signal_steps
  from pgflow.steps as s where s.flow_slug = v_run.flow_slug and s.step_type = 'signal';
  select * into v_step from pgflow.steps as s
  where s.flow_slug = v_run.flow_slug and s.step_slug = send_signal.step_slug;
  v_signal_steps := case when v_signal_steps is null then 'The flow has no signal step.'
    else format('Its signal steps: %s (slugs are case-sensitive).', v_signal_steps) end;
  if not found then
    raise exception 'Flow "%" of run % has no signal step "%".', v_run.flow_slug, run_id, step_slug
      using errcode = 'P0002', hint = v_signal_steps;
  end if;
  if v_step.step_type <> 'signal' then
    raise exception 'Flow "%" of run % has no signal step "%".', v_run.flow_slug, run_id, step_slug
      using errcode = '22023', hint = v_signal_steps,
        detail = format('"%s" is a %s step: its tasks report its output.', step_slug, v_step.step_type);
  end if;
  if payload is null then
    raise exception 'The payload of a signal must not be SQL NULL.' using errcode = '22004',
      hint = 'Pass a JSON value; ''null''::jsonb is one.';
  end if;
  v_problem := pgflow.schema_violation(payload, v_step.payload_schema);
  if v_problem is not null then
    raise exception 'The payload does not match the schema of signal step "%" of flow "%".', step_slug, v_run.flow_slug
      using errcode = '22023', detail = v_problem, hint = 'Nothing was changed: send a payload that matches.';
  end if;
  if v_run.status <> 'started' then
    raise exception 'Run % is %, so it takes no signal.', run_id, v_run.status
      using errcode = '55000',
        hint = case when v_run.status = 'failed'
          then 'Nothing was changed. Retry the run (pgflow.retry_run), then send the signal.'
          else 'Nothing was changed.' end;
  end if;

  select * into v_signal from pgflow.signals as sg
  where sg.run_id = send_signal.run_id and sg.step_slug = send_signal.step_slug;
  if found then
    raise exception 'Step "%" of run % has its signal already (received at %).', step_slug, run_id,
      date_trunc('second', v_signal.received_at)
      using errcode = '23505', hint = 'A signal step takes one signal. Nothing was changed.';
  end if;
  select * into v_state from pgflow.step_states as ss
  where ss.run_id = send_signal.run_id and ss.step_slug = send_signal.step_slug
  for update;
  if v_state.status not in ('created', 'started') then
    raise exception 'Step "%" of run % is % already, so it takes no signal.', step_slug, run_id, v_state.status
      using errcode = '55000',
        detail = nullif(concat_ws(': ', v_state.skip_reason, v_state.error_message), ''),
        hint = 'Nothing was changed.';
  end if;
  -- GUARD: a wait that ran out takes no signal, even before a sweep has ended it.
  if v_state.status = 'started' and v_step.opt_timeout is not null
    and v_state.started_at + make_interval(secs => v_step.opt_timeout) <= clock_timestamp() then
    raise exception 'Step "%" of run % stopped waiting for its signal at %.', step_slug, run_id,
      date_trunc('second', v_state.started_at + make_interval(secs => v_step.opt_timeout))
      using errcode = '55000',
        detail = format('It waits %s s for its signal; the next stall-recovery sweep %s it.', v_step.opt_timeout,
          case when v_step.when_exhausted = 'fail' then 'fails' else 'skips' end),
        hint = 'Nothing was changed.';
  end if;

  insert into pgflow.signals (run_id, step_slug, payload, used_at)
  values (send_signal.run_id, send_signal.step_slug, send_signal.payload,
    case when v_state.status = 'started' then clock_timestamp() end)
  returning * into v_signal;
  perform pgflow._emit_event(run_id, 'signal:received', step_slug,
    case when v_state.status = 'started' then 'completed' else 'created' end);
  perform pgflow._record_action('signal', v_run.flow_slug, run_id, step_slug,
    jsonb_build_object('payload', payload));
  if v_state.status = 'started' then
    perform pgflow._complete_step(run_id, step_slug, payload);
    perform pgflow._advance_run(run_id);
  end if;
  return v_signal;
end;
$$;

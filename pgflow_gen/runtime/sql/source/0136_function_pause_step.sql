-- Pauses a step of a flow: from now on no task of it starts, in any run and in either queue mode
-- (claims hold its messages, which use no attempt); tasks already started finish; the other steps
-- go on. Pausing a paused step keeps its paused_at and takes the new reason. Returns the pause.
-- A signal step runs no task and cannot be paused (engine 0011), nor can a subflow step (engine 0028).
create function pgflow.pause_step(flow_slug text, step_slug text, reason text default null)
returns pgflow.step_pauses
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  v_pause pgflow.step_pauses;
begin
  perform pgflow._require_step(flow_slug, step_slug);
  if exists (
    select 1 from pgflow.steps as s
    where s.flow_slug = pause_step.flow_slug and s.step_slug = pause_step.step_slug and s.step_type = 'signal'
  ) then
    raise exception 'Step "%" of flow "%" is a signal step: it runs no task, so there is nothing to pause.',
      step_slug, flow_slug
      using errcode = '22023', hint = 'Pause the steps that depend on it instead.';
  end if;
  if exists (
    select 1 from pgflow.steps as s
    where s.flow_slug = pause_step.flow_slug and s.step_slug = pause_step.step_slug and s.subflow_slug is not null
  ) then
    raise exception 'Step "%" of flow "%" is a subflow step: its tasks are child runs, so there is nothing to pause.',
      step_slug, flow_slug
      using errcode = '22023', hint = 'Pause the steps of its subflow, or the steps that depend on it, instead.';
  end if;
  insert into pgflow.step_pauses (flow_slug, step_slug, reason)
  values (pause_step.flow_slug, pause_step.step_slug, pause_step.reason)
  on conflict on constraint step_pauses_pkey do update set reason = excluded.reason
  returning * into v_pause;
  perform pgflow._record_action('pause', flow_slug, null, step_slug,
    case when reason is not null then jsonb_build_object('reason', reason) end);
  return v_pause;
end;
$$;

-- Records an operator's action in pgflow.operator_actions (engine 0020), from inside the action's
-- own function and transaction: the login role (session_user) as the actor, the server's clock,
-- and the caller's own label (the setting pgflow.action_label, at most 200 characters; null when
-- unset) apart. Called by cancel_run, retry_run, send_signal, pause_step, resume_step,
-- set_step_limits, reset_step_limits, pause_schedule and resume_schedule.
create function pgflow._record_action(
  action text, flow_slug text, run_id uuid, step_slug text, detail jsonb
)
returns void
language sql
volatile
set search_path = ''
as $$
  insert into pgflow.operator_actions (action, actor, run_id, flow_slug, step_slug, detail, acted_at, label)
  values (action, session_user, run_id, flow_slug, step_slug, detail, clock_timestamp(),
    left(nullif(current_setting('pgflow.action_label', true), ''), 200))
$$;

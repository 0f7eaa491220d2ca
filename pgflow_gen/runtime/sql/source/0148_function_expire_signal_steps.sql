-- Ends the waits that ran out: a signal step that has waited longer than its timeout (opt_timeout
-- seconds; null waits for ever) fails, and its run with it (when_exhausted = fail), or is skipped
-- with skip_reason signal_timed_out (skip, skip-cascade) and its run moves on. A run locked by
-- someone else right now is left for the next sweep. Returns how many steps it ended.
-- Called by requeue_stalled_tasks, which one worker at a time runs every sweep interval.
-- Locks each run, then its step state, as every callback does.
create function pgflow._expire_signal_steps()
returns int
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_wait record;
  v_message text;
  v_count int := 0;
begin
  for v_wait in
    -- From the runs under way (engine 0024): the runs' status index finds them, so a long
    -- history costs nothing here (reading the signal steps' states first read every finished
    -- run's, 12 ms at 100,000 finished runs; 0.4 ms now).
    select ss.run_id, ss.step_slug, s.opt_timeout, s.when_exhausted
    from pgflow.runs as r
    join pgflow.step_states as ss on ss.run_id = r.run_id
    join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
    where r.status = 'started'
      and s.step_type = 'signal' and s.opt_timeout is not null and ss.status = 'started'
      and ss.started_at + make_interval(secs => s.opt_timeout) <= clock_timestamp()
    order by ss.run_id, ss.step_slug
  loop
    perform 1 from pgflow.runs as r
    where r.run_id = v_wait.run_id and r.status = 'started'
    for update skip locked;
    continue when not found;
    -- GUARD: re-read under the run's lock: a signal may have come meanwhile.
    perform 1 from pgflow.step_states as ss
    where ss.run_id = v_wait.run_id and ss.step_slug = v_wait.step_slug and ss.status = 'started'
    for update;
    continue when not found;

    v_message := format('No signal came within %s s, the step''s timeout.', v_wait.opt_timeout);
    if v_wait.when_exhausted = 'fail' then
      update pgflow.step_states as ss
      set status = 'failed', failed_at = clock_timestamp(), remaining_tasks = null, error_message = v_message
      where ss.run_id = v_wait.run_id and ss.step_slug = v_wait.step_slug;
      perform pgflow._emit_event(v_wait.run_id, 'step:failed', v_wait.step_slug, 'failed');
      perform pgflow._fail_run(v_wait.run_id);
    else
      if v_wait.when_exhausted = 'skip' then
        perform pgflow._skip_step(v_wait.run_id, v_wait.step_slug, 'signal_timed_out', v_message);
      else
        perform pgflow._skip_step_cascade(v_wait.run_id, v_wait.step_slug, 'signal_timed_out', v_message);
      end if;
      perform pgflow._advance_run(v_wait.run_id);
    end if;
    v_count := v_count + 1;
  end loop;
  return v_count;
end;
$$;

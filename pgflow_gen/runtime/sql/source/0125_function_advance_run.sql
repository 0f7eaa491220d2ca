-- Moves every ready step of a run (created, no remaining dependencies) forward, in step order:
-- evaluates its condition once, then skips it, fails the run, completes it at once when it has no
-- tasks, or starts it (tasks + one message each; a keyed step's tasks are parked, engine 0018). A
-- signal step completes with the signal it received early, or starts waiting for one (no task, no
-- message). A subflow step starts its child runs (engine 0028). Skips and instant completions
-- (a child run may finish at once) can ready more steps, so it repeats until a pass changes
-- nothing but starts. A run that started nothing may be finished, so then it tries to complete it.
-- Returns false when the run failed. Caller holds the run row lock.
create function pgflow._advance_run(run_id uuid)
returns boolean
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_step record;
  v_target jsonb;
  v_again boolean := true;
  v_started boolean := false;
  v_payload jsonb;
begin
  while v_again loop
    v_again := false;
    for v_step in
      select ss.step_slug, ss.flow_slug, ss.initial_tasks, s.step_type, s.deps_count, s.queue_name,
        s.opt_start_delay, s.required_input_pattern, s.forbidden_input_pattern, s.when_unmet, r.input,
        s.opt_concurrency_key, s.subflow_slug
      from pgflow.step_states as ss
      join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
      join pgflow.runs as r on r.run_id = ss.run_id
      where ss.run_id = _advance_run.run_id and ss.status = 'created' and ss.remaining_deps = 0
      order by s.step_index
    loop
      -- GUARD: conditions are evaluated once, now that the step is ready.
      if v_step.required_input_pattern is not null or v_step.forbidden_input_pattern is not null then
        if v_step.deps_count = 0 then
          v_target := v_step.input;
        else
          select coalesce(jsonb_object_agg(d.dep_slug, dep.output), '{}') into v_target
          from pgflow.deps as d
          join pgflow.step_states as dep on dep.run_id = _advance_run.run_id and dep.step_slug = d.dep_slug
          where d.flow_slug = v_step.flow_slug and d.step_slug = v_step.step_slug
            and dep.status = 'completed';
        end if;
        if not ((v_step.required_input_pattern is null or v_target @> v_step.required_input_pattern)
          and (v_step.forbidden_input_pattern is null or not v_target @> v_step.forbidden_input_pattern)) then
          if v_step.when_unmet = 'fail' then
            update pgflow.step_states as ss
            set status = 'failed', error_message = 'Condition not met', failed_at = clock_timestamp()
            where ss.run_id = _advance_run.run_id and ss.step_slug = v_step.step_slug
              and ss.status = 'created';
            continue when not found;
            perform pgflow._emit_event(run_id, 'step:failed', v_step.step_slug, 'failed');
            perform pgflow._fail_run(run_id);
            return false;
          elsif v_step.when_unmet = 'skip' then
            v_again := pgflow._skip_step(run_id, v_step.step_slug, 'condition_unmet', null) or v_again;
          else
            v_again := pgflow._skip_step_cascade(run_id, v_step.step_slug, 'condition_unmet', null) > 0
              or v_again;
          end if;
          continue;
        end if;
      end if;

      -- A signal step runs no task: it takes a signal that came early at once, else it waits.
      if v_step.step_type = 'signal' then
        -- GUARD: a skip-cascade earlier in this pass may have closed the step already.
        perform 1 from pgflow.step_states as ss
        where ss.run_id = _advance_run.run_id and ss.step_slug = v_step.step_slug and ss.status = 'created';
        continue when not found;
        update pgflow.signals as sg set used_at = clock_timestamp()
        where sg.run_id = _advance_run.run_id and sg.step_slug = v_step.step_slug
        returning sg.payload into v_payload;
        if found then
          perform pgflow._complete_step(run_id, v_step.step_slug, v_payload);
          v_again := true;
        else
          update pgflow.step_states as ss
          set status = 'started', started_at = clock_timestamp(), remaining_tasks = 1
          where ss.run_id = _advance_run.run_id and ss.step_slug = v_step.step_slug;
          perform pgflow._emit_event(run_id, 'step:started', v_step.step_slug, 'started');
        end if;
        continue;
      end if;

      if v_step.initial_tasks is null then
        raise exception 'Step "%" of run % is ready but its task count is unknown.', v_step.step_slug, run_id
          using hint = 'This is an engine bug: a dependent map learns its size when its dependency completes.';
      end if;
      if v_step.initial_tasks = 0 then
        perform pgflow._complete_step(run_id, v_step.step_slug,
          case when v_step.step_type = 'map' then '[]'::jsonb end);
        v_again := true;
        continue;
      end if;

      -- GUARD: a skip-cascade earlier in this pass may have closed the step already.
      update pgflow.step_states as ss
      set status = 'started', started_at = clock_timestamp(), remaining_tasks = ss.initial_tasks
      where ss.run_id = _advance_run.run_id and ss.step_slug = v_step.step_slug and ss.status = 'created';
      continue when not found;
      if v_step.subflow_slug is not null then
        -- A subflow step's tasks start child runs (engine 0028), which may even finish at once.
        perform pgflow._emit_event(run_id, 'step:started', v_step.step_slug, 'started');
        perform pgflow._start_subflow_children(run_id, v_step.step_slug);
        -- GUARD: a child that could not start may have failed the run.
        if not exists (select 1 from pgflow.runs as r where r.run_id = _advance_run.run_id and r.status = 'started') then
          return false;
        end if;
        v_again := true;
        continue;
      elsif v_step.opt_concurrency_key is null then
        perform pgflow._enqueue_step_tasks(run_id, v_step.flow_slug, v_step.step_slug, v_step.queue_name,
          v_step.initial_tasks, coalesce(v_step.opt_start_delay, 0));
      else
        -- A keyed step's tasks are parked under their key's value (engine 0018); they get their
        -- messages as their key has room, when this transaction commits.
        perform pgflow._park_keyed_tasks(v_step.flow_slug, v_step.step_slug, v_step.queue_name,
          v_step.opt_concurrency_key, coalesce(v_step.opt_start_delay, 0), array[run_id],
          array[v_step.initial_tasks]);
      end if;
      perform pgflow._emit_event(run_id, 'step:started', v_step.step_slug, 'started');
      v_started := true;
    end loop;
  end loop;

  if not v_started then
    perform pgflow._maybe_complete_run(run_id);
  end if;
  return true;
end;
$$;

-- Notes what happened to a keyed task (engine 0018), a row trigger function on pgflow.step_tasks,
-- for pgflow._balance_concurrency_keys to settle when the transaction commits: a keyed task queued
-- again without a message (retry_run) is parked, with the step's start delay (new tasks are parked
-- by pgflow._park_keyed_tasks); an admitted task (one with a message) that finishes frees its
-- place, which pgflow._pass_concurrency_places gives to the next parked task of its key when it
-- completed (else the commit frees it); a parked task that finishes leaves its key's line. Its
-- triggers fire only for keyed tasks (their WHEN clauses), so a step without a key pays nothing.
create function pgflow._note_concurrency_event()
returns trigger
language plpgsql
set search_path = ''
as $$
begin
  if new.status in ('queued', 'started') then
    -- Queued again by retry_run, which leaves a keyed task without a message: it is parked.
    insert into pgflow.parked_tasks (flow_slug, step_slug, concurrency_key, run_id, task_index, not_before)
    select new.flow_slug, new.step_slug, new.concurrency_key, new.run_id, new.task_index,
      clock_timestamp() + make_interval(secs => coalesce(s.opt_start_delay, 0))
    from pgflow.steps as s
    where s.flow_slug = new.flow_slug and s.step_slug = new.step_slug;
    insert into pgflow.concurrency_events (flow_slug, step_slug, concurrency_key, parked)
    values (new.flow_slug, new.step_slug, new.concurrency_key, true);
  elsif old.message_id is null then
    insert into pgflow.concurrency_events (flow_slug, step_slug, concurrency_key, gone_run_id, gone_task_index)
    values (old.flow_slug, old.step_slug, old.concurrency_key, old.run_id, old.task_index);
  else
    insert into pgflow.concurrency_events (flow_slug, step_slug, concurrency_key, released)
    values (old.flow_slug, old.step_slug, old.concurrency_key, 1);
    perform set_config('pgflow.concurrency_passes', 'pending', true);
  end if;
  perform set_config('pgflow.concurrency_events', 'pending', true);
  return null;
end;
$$;

-- Only a move between waiting or running (queued, started) and finished counts.
create trigger step_tasks_keyed_status
after update of status on pgflow.step_tasks
for each row
when (old.concurrency_key is not null
  and (old.status in ('queued', 'started')) <> (new.status in ('queued', 'started')))
execute function pgflow._note_concurrency_event();

-- What a task's message carries of its run's priority (engine 0031): {"priority": n} for a run
-- with a priority above 0, merged into the message beside the task key; nothing for the
-- default, so the messages of runs without a priority are as they always were. Inlined into
-- the statements that send messages.
create function pgflow._priority_key(priority int)
returns jsonb
language sql
immutable
parallel safe
set search_path = ''
as $$
  select case when priority > 0 then jsonb_build_object('priority', priority) else '{}'::jsonb end;
$$;

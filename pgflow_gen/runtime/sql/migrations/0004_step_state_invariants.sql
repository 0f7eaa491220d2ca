-- Engine migration 0004: step state invariants.
--
-- A started step knows how many tasks it has: `initial_tasks` is set before a step starts (a
-- single step has 1 from the start of the run; a map step learns its size from its array). The
-- engine never breaks this; the check makes it a guarantee, as pgflow has it. A database holding
-- a row that breaks it cannot be migrated: the migration fails and changes nothing.

alter table pgflow.step_states
  add constraint initial_tasks_is_known_when_started
  check (status <> 'started' or initial_tasks is not null);

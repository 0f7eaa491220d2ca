-- Status values as domains rather than per-table CHECK constraints: a domain's check is compiled
-- once per session (type cache), while a table's CHECK expressions are rebuilt for every
-- statement that writes the table, and these tables are written on every task transition.
create domain pgflow.run_status as text
  constraint run_status_is_known check (value in ('started', 'completed', 'failed', 'cancelled'));

create domain pgflow.step_status as text
  constraint step_status_is_known check (
    value in ('created', 'started', 'completed', 'failed', 'skipped', 'cancelled')
  );

create domain pgflow.task_status as text
  constraint task_status_is_known check (
    value in ('queued', 'started', 'completed', 'failed', 'skipped', 'cancelled')
  );

create domain pgflow.skip_reason as text
  constraint skip_reason_is_known check (
    value in ('condition_unmet', 'handler_failed', 'dependency_skipped', 'signal_timed_out')
  );

-- Seconds before a failed task becomes visible again: base_delay * 2^attempts_count, where
-- attempts_count already includes the attempt that just failed. Called by fail_task.
create function pgflow.calculate_retry_delay(base_delay numeric, attempts_count int)
returns int
language sql
immutable
set search_path = ''
as $$
  select least(floor(base_delay * power(2::numeric, attempts_count)), 2147483647)::int
$$;

-- start_debounced_runs's body with the clock as a parameter (engine 0030), so that tests can
-- drive it; only the engine's owner calls it. See pgflow.start_debounced_runs.
create function pgflow._start_debounced_runs(now timestamptz)
returns table (flow_slug text, debounce_key text, starts int, run_id uuid)
language plpgsql
volatile
set search_path = ''
as $$
declare
  v_burst pgflow.debounced_starts;
  v_run pgflow.runs;
begin
  for v_burst in
    delete from pgflow.debounced_starts as d
    where (d.flow_slug, d.debounce_key) in (
      select p.flow_slug, p.debounce_key from pgflow.debounced_starts as p
      where p.start_at <= now order by p.start_at limit 100
      for update skip locked
    )
    returning *
  loop
    v_run := pgflow._start_debounced(v_burst);
    flow_slug := v_burst.flow_slug;
    debounce_key := v_burst.debounce_key;
    starts := v_burst.starts;
    run_id := v_run.run_id;
    return next;
  end loop;
end;
$$;

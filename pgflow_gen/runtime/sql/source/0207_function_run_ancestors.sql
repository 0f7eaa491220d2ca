-- A run and the runs above it (engine 0028): the run itself at depth 1, its parent at 2, and so
-- on up to the top run, but never more than 9 rows (subflows nest at most 8 deep, so a longer
-- chain is a cycle made in plain SQL). No locks.
create function pgflow._run_ancestors(run_id uuid)
returns table (run_id uuid, depth int, flow_slug text, traceparent text)
language sql
stable
set search_path = ''
as $$
  with recursive up (run_id, depth, flow_slug, traceparent, parent_run_id) as (
    select r.run_id, 1, r.flow_slug, r.traceparent, r.parent_run_id
    from pgflow.runs as r where r.run_id = _run_ancestors.run_id
    union all
    select r.run_id, u.depth + 1, r.flow_slug, r.traceparent, r.parent_run_id
    from up as u
    join pgflow.runs as r on r.run_id = u.parent_run_id
    where u.depth < 9
  )
  select u.run_id, u.depth, u.flow_slug, u.traceparent from up as u
$$;

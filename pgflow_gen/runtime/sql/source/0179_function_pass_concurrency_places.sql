-- Gives the places of keyed tasks that finished to the oldest parked tasks of their keys (engine
-- 0018), at once: the parked tasks get their messages in the transaction that completed, so the
-- claim that follows a completion (complete_and_claim) can take them, and the keys' counts do not
-- change. complete_task and complete_tasks call it when pgflow._note_concurrency_event flagged a
-- freed place (a setting local to the transaction), so completions of tasks without a key pay one
-- setting read. Waits for no lock (pgflow._unpark_tasks passes over what another transaction
-- holds), and the keys' rows are only read. A place with no parked task to take it, or of a key
-- that holds more than its limit (lowered meanwhile), is freed when the transaction commits
-- (pgflow._balance_concurrency_keys).
create function pgflow._pass_concurrency_places()
returns void
language plpgsql
set search_path = ''
set enable_seqscan = off
as $$
declare
  v_key record;
  v_passed int;
begin
  if current_setting('pgflow.concurrency_passes', true) is distinct from 'pending' then
    return;
  end if;
  perform set_config('pgflow.concurrency_passes', '', true);
  for v_key in
    select e.flow_slug, e.step_slug, e.concurrency_key, sum(e.released)::int as released
    from pgflow.concurrency_events as e
    where e.xact = pg_current_xact_id() and e.released > 0
    group by e.flow_slug, e.step_slug, e.concurrency_key
    order by e.flow_slug, e.step_slug, e.concurrency_key
  loop
    -- GUARD: a key with no parked task has nothing to pass, and one above its limit (lowered
    -- meanwhile) passes nothing: the commit frees their places.
    continue when not exists (
      select 1 from pgflow.parked_tasks as p
      where p.flow_slug = v_key.flow_slug and p.step_slug = v_key.step_slug
        and p.concurrency_key = v_key.concurrency_key
    ) or not exists (
      select 1
      from pgflow.concurrency_keys as k
      join pgflow.steps as s on s.flow_slug = k.flow_slug and s.step_slug = k.step_slug
      where k.flow_slug = v_key.flow_slug and k.step_slug = v_key.step_slug
        and k.concurrency_key = v_key.concurrency_key
        and k.admitted <= coalesce(s.opt_concurrency_limit, k.admitted)
    );
    v_passed := pgflow._unpark_tasks(v_key.flow_slug, v_key.step_slug, v_key.concurrency_key,
      v_key.released);
    if v_passed > 0 then
      delete from pgflow.concurrency_events as e
      where e.xact = pg_current_xact_id() and e.flow_slug = v_key.flow_slug and e.step_slug = v_key.step_slug
        and e.concurrency_key = v_key.concurrency_key and e.released > 0;
      if v_key.released > v_passed then
        insert into pgflow.concurrency_events (flow_slug, step_slug, concurrency_key, released)
        values (v_key.flow_slug, v_key.step_slug, v_key.concurrency_key, v_key.released - v_passed);
      end if;
    end if;
  end loop;
end;
$$;

-- The worker liveness settings (pgflow.heartbeat_interval, pgflow.live_within,
-- pgflow.stalled_after; null when unset) as this session must see them (engine 0020): the
-- session's own values when they are the database's (ALTER DATABASE ... SET; the usual case,
-- one catalog lookup) or the session is an operator's (pgflow._session_is_operator); else the
-- database's, whatever the session (or its role) set, so a worker cannot shorten the stall rule
-- and take live workers' tasks. Called by pgflow.worker_liveness. No writes.
create function pgflow._engine_settings(
  out heartbeat_interval text,
  out live_within text,
  out stalled_after text
)
language plpgsql
stable
set search_path = ''
as $$
declare
  v_item text;
  v_database text[] := array[null, null, null];
begin
  -- Set nowhere (the usual case; engine 0021): the defaults, without reading the catalog. A
  -- setting the database (or the role) sets, or the session ever set, is defined (not null) for
  -- the whole session, so a null one is one the database does not set either.
  if current_setting('pgflow.heartbeat_interval', true) is null
      and current_setting('pgflow.live_within', true) is null
      and current_setting('pgflow.stalled_after', true) is null then
    return;
  end if;
  heartbeat_interval := nullif(current_setting('pgflow.heartbeat_interval', true), '');
  live_within := nullif(current_setting('pgflow.live_within', true), '');
  stalled_after := nullif(current_setting('pgflow.stalled_after', true), '');
  foreach v_item in array coalesce((
    select s.setconfig from pg_catalog.pg_db_role_setting as s
    where s.setrole = 0
      and s.setdatabase = (select d.oid from pg_catalog.pg_database as d where d.datname = current_database())
  ), '{}') loop
    case split_part(v_item, '=', 1)
      when 'pgflow.heartbeat_interval' then v_database[1] := nullif(substr(v_item, strpos(v_item, '=') + 1), '');
      when 'pgflow.live_within' then v_database[2] := nullif(substr(v_item, strpos(v_item, '=') + 1), '');
      when 'pgflow.stalled_after' then v_database[3] := nullif(substr(v_item, strpos(v_item, '=') + 1), '');
      else null;
    end case;
  end loop;
  if array[heartbeat_interval, live_within, stalled_after] is not distinct from v_database
    or pgflow._session_is_operator() then
    return;
  end if;
  heartbeat_interval := v_database[1];
  live_within := v_database[2];
  stalled_after := v_database[3];
end;
$$;

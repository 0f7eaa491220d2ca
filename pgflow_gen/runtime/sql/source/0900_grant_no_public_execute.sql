-- Least privilege (engine 0019): no engine function runs for PUBLIC. The functions a role may call
-- are security definer (they run as the engine's owner and check their caller), and `pgflow-gen db
-- roles` grants each group role its own; the owner and superusers keep doing everything.
revoke execute on all functions in schema pgflow from public;

-- Engine 0019 also set these default privileges, meant for the functions later migrations add.
-- Per-schema defaults cannot take away what PostgreSQL grants PUBLIC globally, so they change
-- nothing: every migration that creates a function revokes PUBLIC's EXECUTE itself (since 0020).
alter default privileges in schema pgflow revoke execute on functions from public;

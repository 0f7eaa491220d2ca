-- Least privilege (engine 0019): no engine function runs for PUBLIC. The functions a role may call
-- are security definer (they run as the engine's owner and check their caller), and `pgflow-gen db
-- roles` grants each group role its own; the owner and superusers keep doing everything. Functions
-- that later migrations add by the same owner start without PUBLIC's EXECUTE too.
revoke execute on all functions in schema pgflow from public;

alter default privileges in schema pgflow revoke execute on functions from public;

"""The runtime: database provisioning, engine migrations, and (soon) workers and the client.

It imports nothing from `pgflow_gen.spec` or `pgflow_gen.codegen` and talks to PostgreSQL through
psycopg only.
"""

"""The web dashboard and the engine's Prometheus metrics (`pgflow-gen dashboard`, `pgflow-gen
metrics`): pages rendered on the server from the engine's tables, read-only unless actions are
allowed. Needs the `dashboard` extra (Starlette, uvicorn). Imports the runtime, never the spec or
the code generator.

    from pgflow_gen.dashboard.app import create_app

    app = create_app("postgresql://app@db/app")  # any ASGI server runs it
"""

"""The edge where pgflow-gen meets its SQL engine: every statement the worker, the client, the
CLI, the dashboard and the engine's administration send (`*_statements`, `statements` for those
several parts send), the engine roles and their grants (`roles`), and the support window: which
engine versions this release runs on (`support`). It imports no other part of pgflow-gen but
its errors, so everything that talks to the engine sits above it."""

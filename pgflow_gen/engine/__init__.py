"""The edge where pgflow-gen meets its SQL engine (growing: the "engine gateway" issue). Today it
holds the support window: which engine versions this release runs on. It imports no other part
of pgflow-gen but its errors."""

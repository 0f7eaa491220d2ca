"""Starting a run in the transaction of an application's ORM session (docs/starting-runs.md)."""

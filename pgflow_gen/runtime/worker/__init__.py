"""The worker process: it starts (`process`: flags, the database, the handlers), compiles or
verifies its flow (`startup`), then runs its loop (`loop`), whose parts poll and claim (`poller`,
`listener`), run handlers in slots (`slots`, `task_runner`, `context`), send results
(`reporter`, `results`), keep its registration and leases (`heartbeat`), and run the schedules
(`scheduler`, `cron_slots`), all through one `session` (`psycopg_session`, which reads what each
claim's notices say with `claim_notices`). `app_worker` runs the same loop inside an
application's own process. The public names are `pgflow_gen.runtime`'s.
"""

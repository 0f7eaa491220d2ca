"""Every statement the dashboard sends, by name. Each is a string literal (a `LiteralString`
psycopg accepts as a query); parameters are always bound, never formatted in.

The pages read the engine's tables and PGMQ's queue metrics directly: nothing here writes, except
the actions (through the engine's own functions) and their record in `pgflow.operator_actions`.
What the pages read about tasks comes from the runs under way (the runs' status index finds
them) and from the queues' archives (their archived_at index), never from a scan of the tasks
table, whose history grows with every run; `benchmarks/dashboard.py` times every page with
100,000 runs.
"""

from __future__ import annotations

from typing import Final, LiteralString

from pgflow_gen.engine import statements

#: Joins each run of `r` to its tasks by the tasks' primary key, one run at a time (`offset 0`
#: keeps the planner from hashing the whole tasks table instead, as it would for a few thousand
#: runs: the history would then cost every page).
_TASKS_OF_EACH_RUN: Final[LiteralString] = (
    " cross join lateral ("
    "   select x.* from pgflow.step_tasks as x where x.run_id = r.run_id offset 0"
    " ) as t"
)

# -- overview ------------------------------------------------------------------------------------
#: () -> each flow with its runs started in the last hour (and any still running) by status.
FLOWS: Final[LiteralString] = (
    "select f.flow_slug, f.queue_mode,"
    " (select count(*) from pgflow.steps as s where s.flow_slug = f.flow_slug)::int as steps,"
    " coalesce(r.started, 0)::int as started, coalesce(r.completed, 0)::int as completed,"
    " coalesce(r.failed, 0)::int as failed, coalesce(r.cancelled, 0)::int as cancelled"
    " from pgflow.flows as f"
    " left join ("
    "   select flow_slug,"
    "     count(*) filter (where status = 'started') as started,"
    "     count(*) filter (where status = 'completed') as completed,"
    "     count(*) filter (where status = 'failed') as failed,"
    "     count(*) filter (where status = 'cancelled') as cancelled"
    "   from pgflow.runs"
    "   where started_at > now() - interval '1 hour' or status = 'started'"
    "   group by flow_slug"
    " ) as r using (flow_slug)"
    " order by f.flow_slug"
)
#: () -> tasks that finished (left their queue: completed, failed, skipped or cancelled) per
#: flow and minute of the last hour (minute 0 is the current one), from the queues' archives.
TASKS_PER_MINUTE: Final[LiteralString] = (
    "select s.flow_slug,"
    " floor(extract(epoch from date_trunc('minute', now()) - f.minute) / 60)::int as minute,"
    " sum(f.tasks)::int as tasks"
    " from pgflow.finished_tasks(interval '1 hour', by_step => false) as f"
    " join (select distinct queue_name, flow_slug from pgflow.steps) as s"
    "   on s.queue_name = f.queue_name"
    " group by 1, 2"
)

# -- queues --------------------------------------------------------------------------------------
#: (freshness seconds) -> every step route (signal steps have none): its live workers and
#: pause; the tasks of the step waiting (and since when the oldest waits), running and parked,
#: and its last claim, among the runs under way (found by the runs' status index, so the
#: history costs nothing); and its tasks that finished in the last minute (from the queue's
#: archive).
ROUTES: Final[LiteralString] = (
    "with active as ("
    "   select t.flow_slug, t.step_slug,"
    "     count(*) filter (where t.status = 'queued') as queued,"
    "     count(*) filter (where t.status = 'started') as running,"
    "     max(t.started_at) as last_claim_at,"
    "     min(t.queued_at) filter (where t.status = 'queued') as oldest_queued_at,"
    # A parked task (requeued too often by stall recovery) keeps its run started.
    "     count(*) filter (where t.status = 'started' and t.permanently_stalled_at is not null)"
    "       as parked"
    "   from pgflow.runs as r" + _TASKS_OF_EACH_RUN + "   where r.status = 'started'"
    "   group by t.flow_slug, t.step_slug"
    " ), went as ("
    "   select f.queue_name, f.step_slug, sum(f.tasks) as tasks"
    "   from pgflow.finished_tasks(interval '1 minute') as f group by 1, 2"
    " )"
    " select c.flow_slug, c.step_slug, c.step_index, c.queue_name, c.live_workers, c.covered,"
    " p.reason as pause_reason, p.paused_at, p.flow_slug is not null as paused,"
    " coalesce(a.queued, 0)::int as queued, coalesce(a.running, 0)::int as running,"
    " a.last_claim_at, a.oldest_queued_at, coalesce(w.tasks, 0)::int as went_last_minute,"
    " coalesce(a.parked, 0)::int as parked"
    " from pgflow.queue_coverage(make_interval(secs => %s)) as c"
    " left join pgflow.step_pauses as p"
    "   on p.flow_slug = c.flow_slug and p.step_slug = c.step_slug"
    " left join active as a on a.flow_slug = c.flow_slug and a.step_slug = c.step_slug"
    " left join went as w on w.queue_name = c.queue_name and w.step_slug = c.step_slug"
    " order by c.flow_slug, c.step_index"
)
#: () -> PGMQ's metrics of every queue the engine's steps use: messages in all and visible now,
#: the oldest one's age, and how many were ever sent.
QUEUE_METRICS: Final[LiteralString] = (
    "select m.queue_name, m.queue_length, m.queue_visible_length, m.oldest_msg_age_sec,"
    " m.total_messages"
    " from (select distinct s.queue_name from pgflow.steps as s"
    "       join pgmq.meta as q on q.queue_name = s.queue_name"
    "       where s.step_type <> 'signal') as used,"
    " lateral pgmq.metrics(used.queue_name) as m"
    " order by m.queue_name"
)
#: () -> the liveness rule's "live within", in seconds.
LIVE_WITHIN: Final[LiteralString] = (
    "select extract(epoch from (pgflow.worker_liveness()).live_within)::float8 as seconds"
)

# -- workers -------------------------------------------------------------------------------------

# -- runs ----------------------------------------------------------------------------------------
_RUNS_FILTERED: Final[LiteralString] = (
    "   select r.run_id, r.flow_slug, r.status, r.started_at, r.retry_count, r.cancel_reason,"
    "     coalesce(r.completed_at, r.failed_at, r.cancelled_at) as ended_at"
    "   from pgflow.runs as r"
    "   where (%(flow)s::text is null or r.flow_slug = %(flow)s)"
    "     and (%(status)s::text is null or r.status = %(status)s)"
    "     and (%(low)s::uuid is null or r.run_id between %(low)s and %(high)s)"
)
#: A page's runs with their first failed step and the first line of its error, and the signal
#: steps a running run waits for.
_RUNS_AND_WHY: Final[LiteralString] = (
    " left join lateral ("
    "   select ss.step_slug, left(split_part(btrim(coalesce(ss.error_message, ("
    "     select x.error_message from pgflow.step_tasks as x"
    "     where x.run_id = ss.run_id and x.step_slug = ss.step_slug and x.status = 'failed'"
    "     order by x.failed_at desc limit 1)), E' \\n'), E'\\n', 1), 200) as error_line"
    "   from pgflow.step_states as ss"
    "   where ss.run_id = page.run_id and ss.status = 'failed' order by ss.failed_at limit 1"
    " ) as f on true"
    " left join lateral ("
    "   select array_agg(ss.step_slug order by ss.step_slug) as slugs"
    "   from pgflow.step_states as ss join pgflow.steps as s"
    "     on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug"
    "   where page.status = 'started' and ss.run_id = page.run_id"
    "     and s.step_type = 'signal' and ss.status = 'started'"
    " ) as w on true"
    " order by page.started_at desc, page.run_id desc"
)
#: ({flow, status, low, high, at, id, limit}; NULL filters: any) -> one page of runs, newest
#: first, older than the cursor (at, id) when given (keyset pagination, never OFFSET: the index
#: on start time and id reads one page), each with its first failed step and that step's
#: error's first line, and the signals it waits for; low and high bound the run ids that start
#: with a searched prefix (the primary key finds them). Ask for one more than a page to know
#: whether another follows.
RUNS_OLDER: Final[LiteralString] = (
    "select page.*, f.step_slug as failed_step, f.error_line as failed_error,"
    " coalesce(w.slugs, '{}') as waiting_signals from ("
    + _RUNS_FILTERED
    + "     and (%(at)s::timestamptz is null or (r.started_at, r.run_id) < (%(at)s, %(id)s))"
    "   order by r.started_at desc, r.run_id desc limit %(limit)s"
    " ) as page" + _RUNS_AND_WHY
)
#: As RUNS_OLDER, but the page of runs newer than the cursor (the page before), newest first.
RUNS_NEWER: Final[LiteralString] = (
    "select page.*, f.step_slug as failed_step, f.error_line as failed_error,"
    " coalesce(w.slugs, '{}') as waiting_signals from ("
    + _RUNS_FILTERED
    + "     and (r.started_at, r.run_id) > (%(at)s, %(id)s)"
    "   order by r.started_at, r.run_id limit %(limit)s"
    " ) as page" + _RUNS_AND_WHY
)


# -- one run -------------------------------------------------------------------------------------
def run_summary(version: str) -> LiteralString:
    """(run id) -> the run with its input capped: the first 2,000 characters and its whole
    length (a large input would cost every view its size in time and memory), the task that
    started it when it is a subflow run (engine 0028; nulls before), and the run and step it
    was forked from (engine 0029; nulls before); each step's output comes capped below
    (`run_step_details`)."""
    parent: LiteralString = (
        " parent_run_id, parent_step_slug, parent_task_index,"
        if statements.has_subflows(version)
        else " null::uuid as parent_run_id, null::text as parent_step_slug,"
        " null::int as parent_task_index,"
    )
    forked: LiteralString = (
        " forked_from_run_id, forked_from_step,"
        if version >= "0029"  # fork_run
        else " null::uuid as forked_from_run_id, null::text as forked_from_step,"
    )
    return _RUN_SUMMARY_HEAD + parent + forked + _RUN_SUMMARY_REST


_RUN_SUMMARY_HEAD: Final[LiteralString] = (
    "select run_id, flow_slug, status, remaining_steps, started_at, completed_at,"
    " failed_at, cancelled_at, cancel_reason, idempotency_key, retry_count, retried_at,"
)
_RUN_SUMMARY_REST: Final[LiteralString] = (
    " left(input::text, 2000) as input_head, length(input::text) as input_length"
    " from pgflow.runs where run_id = %s"
)
#: (run id) -> the run's whole input (no row: no such run).
WHOLE_RUN_INPUT: Final[LiteralString] = "select input from pgflow.runs where run_id = %s"


def run_step_details(version: str) -> LiteralString:
    """(run id) -> each step of the run's flow in step order, with its state, its dependencies,
    its tasks' counts and most attempts, its timings, its output (the first 2,000 characters,
    and its whole length), the latest error of its tasks (the failed one, else the last
    retried), and a subflow step's flow (engine 0028; null before)."""
    subflow: LiteralString = (
        " s.subflow_slug," if statements.has_subflows(version) else " null::text as subflow_slug,"
    )
    return _RUN_STEP_DETAILS_HEAD + subflow + _RUN_STEP_DETAILS_REST


_RUN_STEP_DETAILS_HEAD: Final[LiteralString] = (
    "select s.step_slug, s.step_index, s.step_type, s.queue_name,"
)
_RUN_STEP_DETAILS_REST: Final[LiteralString] = (
    " coalesce(s.opt_max_attempts, f.opt_max_attempts) as max_attempts,"
    " coalesce(s.opt_timeout, f.opt_timeout) as timeout,"
    " coalesce((select array_agg(d.dep_slug order by d.dep_slug) from pgflow.deps as d"
    "   where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug), '{}') as dependencies,"
    " s.required_input_pattern, s.forbidden_input_pattern, s.when_unmet,"
    " ss.status, ss.skip_reason, ss.error_message as step_error,"
    " ss.created_at, ss.started_at, ss.completed_at, ss.failed_at,"
    " ss.skipped_at, left(ss.output::text, 2000) as output_head,"
    " length(ss.output::text) as output_length,"
    " t.tasks, t.attempts, t.queued, t.running, t.done, t.failed,"
    " e.task_index as error_task, e.error_message, e.error_at"
    " from pgflow.runs as r"
    " join pgflow.flows as f on f.flow_slug = r.flow_slug"
    " join pgflow.steps as s on s.flow_slug = r.flow_slug"
    " left join pgflow.step_states as ss on ss.run_id = r.run_id and ss.step_slug = s.step_slug"
    " left join lateral ("
    "   select count(*)::int as tasks, max(x.attempts_count) as attempts,"
    "     count(*) filter (where x.status = 'queued')::int as queued,"
    "     count(*) filter (where x.status = 'started')::int as running,"
    "     count(*) filter (where x.status = 'completed')::int as done,"
    "     count(*) filter (where x.status = 'failed')::int as failed"
    "   from pgflow.step_tasks as x where x.run_id = r.run_id and x.step_slug = s.step_slug"
    " ) as t on true"
    " left join lateral ("
    "   select x.task_index, x.error_message,"
    "     coalesce(x.failed_at, x.completed_at, x.started_at, x.queued_at) as error_at"
    "   from pgflow.step_tasks as x"
    "   where x.run_id = r.run_id and x.step_slug = s.step_slug and x.error_message is not null"
    "   order by x.status = 'failed' desc,"
    "     coalesce(x.failed_at, x.completed_at, x.started_at, x.queued_at) desc"
    "   limit 1"
    " ) as e on true"
    " where r.run_id = %s"
    " order by s.step_index"
)
#: (run id, step slug) -> the step's whole output (NULL when it has none, or no such step).
STEP_OUTPUT: Final[LiteralString] = (
    "select output from pgflow.step_states where run_id = %s and step_slug = %s"
)
#: (run id) -> the signals sent to the run, and when each was used.
RUN_SIGNALS: Final[LiteralString] = (
    "select step_slug, received_at, used_at from pgflow.signals where run_id = %s"
    " order by received_at"
)
#: (run id) -> the operators' actions on the run (engine 0016; `label`, the caller's own word
#: beside the login role, engine 0020), oldest first.
RUN_ACTIONS: Final[LiteralString] = (
    "select action, actor, label, step_slug, detail, acted_at from pgflow.operator_actions"
    " where run_id = %s order by acted_at, action_id"
)
#: (flow slug) -> its paused steps.
FLOW_PAUSES: Final[LiteralString] = (
    "select step_slug, reason, paused_at from pgflow.step_pauses where flow_slug = %s"
)

# -- actions -------------------------------------------------------------------------------------
#: (run id) -> the run's flow (an action records it).
RUN_FLOW: Final[LiteralString] = "select flow_slug from pgflow.runs where run_id = %s"

# -- engine metrics ------------------------------------------------------------------------------
#: () -> runs by flow and status (every run the tables hold: pruning bounds them).
RUNS_BY_STATUS: Final[LiteralString] = (
    "select flow_slug, status, count(*)::int as runs from pgflow.runs group by 1, 2 order by 1, 2"
)
#: () -> tasks that stall recovery would take now (their worker is gone or their lease ran
#: out), by flow and step (the engine's own rule, pgflow.find_stalled_tasks).
STALLED_TASKS: Final[LiteralString] = (
    "select r.flow_slug, x.step_slug, count(*)::int as stalled"
    " from pgflow.find_stalled_tasks() as x join pgflow.runs as r on r.run_id = x.run_id"
    " group by 1, 2"
)


def worker_states(version: str) -> LiteralString:
    """(all: include stopped ones) -> how many workers by flow, step, queue and state: the states
    of `statements.workers(version)`, so the metrics count by the engine's one liveness rule as
    `pgflow-gen workers` and the dashboard's workers page do."""
    return (
        "select coalesce(flow_slug, '') as flow_slug, coalesce(step_slug, '') as step_slug,"
        " queue_name, state, count(*)::int as workers from ("
        + statements.workers(version)
        + ") as w group by 1, 2, 3, 4 order by 1, 2, 3, 4"
    )

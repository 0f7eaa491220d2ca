-- Messages of completed tasks, waiting to be archived in batches: complete_task records its
-- message here (a cheap insert) instead of one PGMQ archive call per task. The message stays
-- invisible meanwhile (its lease outlives the task). Drained by start_tasks for its queue and
-- by requeue_stalled_tasks and prune_data_older_than for every queue.
create table pgflow.archivable_messages (
  queue_name text not null,
  message_id bigint not null,
  primary key (queue_name, message_id)
);

-- Messages of completed tasks, waiting to be archived in batches: complete_task records its
-- message here (a cheap insert) instead of one PGMQ archive call per task. The message normally
-- stays invisible meanwhile (its lease outlives the task; a late re-read claims nothing). Drained
-- by start_tasks for its queue and by requeue_stalled_tasks and prune_data_older_than for all.
create table pgflow.archivable_messages (
  queue_name text not null,
  message_id bigint not null,
  primary key (queue_name, message_id)
);

-- Messages of completed tasks waiting to be archived in a batch: complete_task recorded its
-- message here from engine 0003 to 0013, for the next claim to archive. Since 0014 it archives
-- the message itself (cheaper than the drain), and migration 0014 drains what was left; stall
-- recovery (requeue_stalled_tasks) and pruning still drain it.
create table pgflow.archivable_messages (
  queue_name text not null,
  message_id bigint not null,
  primary key (queue_name, message_id)
);

-- Paused steps (pgflow.pause_step): while a step is listed here no task of it starts, in any
-- run; its messages stay queued and use no attempt. pgflow.resume_step removes it.
create table pgflow.step_pauses (
  flow_slug text not null,
  step_slug text not null,
  reason text,
  paused_at timestamptz not null default now(),
  primary key (flow_slug, step_slug),
  foreign key (flow_slug, step_slug) references pgflow.steps (flow_slug, step_slug) on delete cascade
);

-- The messages of a paused step that claims have read and put out of sight (for HOLD seconds at
-- a time; pgflow.claim_tasks), so that resume_step can show exactly these again at once, and not
-- the messages that wait for a retry's delay. Gone with the pause.
create table pgflow.held_messages (
  queue_name text not null,
  message_id bigint not null,
  flow_slug text not null,
  step_slug text not null,
  primary key (queue_name, message_id),
  foreign key (flow_slug, step_slug) references pgflow.step_pauses (flow_slug, step_slug)
    on delete cascade
);

create index held_messages_step_idx on pgflow.held_messages (flow_slug, step_slug);

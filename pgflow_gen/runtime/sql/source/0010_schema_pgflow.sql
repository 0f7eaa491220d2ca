-- The pgflow schema holds the whole engine: definitions, runtime state and the functions that move it.
-- Created once by migration 0001; nothing else lives here.
create schema if not exists pgflow;

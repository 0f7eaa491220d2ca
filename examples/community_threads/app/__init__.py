"""A community-threads app: handlers for the generated communityThreadsV1 flow."""

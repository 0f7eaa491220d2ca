"""A content pipeline app: handlers for the generated contentPipelineV1 flow."""

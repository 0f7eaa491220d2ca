"""Flow specs: YAML files -> pydantic models -> a validated FlowSpec, with located errors."""

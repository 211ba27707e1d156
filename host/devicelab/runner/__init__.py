"""Running a recipe: the orchestrator (one lane per device), the device session, conditions, one cell,
the host's shared work, and the artifacts every row is derived from."""

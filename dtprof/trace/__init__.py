"""The trace directory: its schema, and reading it."""

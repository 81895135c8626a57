"""Worker conformance checks (aiworker conformance)."""

"""Process wiring: the worker process, registries, plugins, telemetry, payload storage."""

"""Process wiring, one module per concern.

- ``worker``: builds and runs a worker process (``aiworker worker``);
- ``worker_set``: which workers this process knows and serves (built-ins,
  ``aiworker.plugins`` entry points, worker modules, spec files);
- ``task_queues``: which workflows and activities each task queue serves;
- ``plugin``: ``AiworkerPlugin``, the Temporal ``SimplePlugin`` that puts all of
  it on a user's own client and worker;
- ``live_registry``: publishing what this process serves, and reading what the
  others publish; ``deployments``: Worker Deployment versions and build ids;
- ``telemetry``, ``otlp``, ``sdk_metrics``, ``logs``, ``probes``: what a process
  exports; ``payload_storage``, ``resources``: stores a process shares;
- ``replay``: the replay gate; ``lambda_handler``: the AWS Lambda entry point;
  ``pipeline_settings``: the settings part of a pipeline's check.
"""

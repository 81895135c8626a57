"""The process side of aiworker, one subpackage per role.

- :mod:`~aiworker.workers.cli`: the ``aiworker`` command line.
- :mod:`~aiworker.workers.client`: starting, watching and waiting on runs
  (``PipelineClient``, the Temporal connection and data converter).
- :mod:`~aiworker.workers.frontdoor`: the HTTP front door (``aiworker serve``).
- :mod:`~aiworker.workers.process`: the worker process and its wiring (the
  plugin, the registries, telemetry, payload storage, deployments, Lambda).
- :mod:`~aiworker.workers.devstack`: ``aiworker dev`` and ``demo`` (the dev
  server, the local model server, the demo site, the supervisor).
- :mod:`~aiworker.workers.conformance` and :mod:`~aiworker.workers.schedules`.
"""

"""Deterministic workflow code; calls workers by activity name only.

Workflows: ``pipeline`` (``PipelineWorkflow``: definition, handlers, the
top-level run), ``foreach`` (``PipelineForEachWorkflow``), ``limits``
(``LimiterWorkflow`` and the permit protocol), ``breakers``
(``SharedBreakerWorkflow``), ``conformance``. What a pipeline run is made of:
``state`` (the run's state), ``dag`` (the scheduler), ``steps`` (the step
runner), ``fanout`` (for_each), ``review`` (the review desk),
``pipeline_limits``, ``budget`` (ledger and deadline), ``calls`` (one worker
call), ``runs`` (which run an object belongs to). Nothing is imported here,
so that a sandboxed run (``AIWORKER_WORKFLOW_SANDBOX=true``; the replay tests),
which re-imports a workflow's modules, loads only what that workflow needs.
"""

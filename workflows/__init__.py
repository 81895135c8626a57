"""Deterministic workflow code; calls workers by activity name only.

Modules: ``pipeline`` (``PipelineWorkflow``), ``foreach``
(``PipelineForEachWorkflow``), ``limiter`` (``LimiterWorkflow``) and their
pure helpers ``budget``, ``calls``, ``permits``. Nothing is imported here, so
that the sandbox, which re-imports a workflow's modules for every run, loads
only what that workflow needs.
"""

"""Evaluations from recorded history (``aiworker eval``): the recorded calls of a
worker read back from Temporal (:mod:`.recorded`), datasets of them
(:mod:`.dataset`), an eval run of a candidate as a Temporal workflow
(:mod:`.run`, workflow in ``workflows/evals.py``), scores and the report
(:mod:`.report`)."""

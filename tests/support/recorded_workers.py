"""``upper-local`` as a later deploy defines it
(``AIWORKER_WORKER_MODULES=support.recorded_workers``): the same worker as
:mod:`support.local_workers` with ``"execution": "activity"`` and another
timeout, for the test that a run keeps the spec it recorded
(``tests/workflows/test_recorded_specs.py``)."""

from __future__ import annotations

from support.local_workers import UpperLocal


class UpperActivity(UpperLocal):
    """``upper-local``, now an activity task with a 9 s timeout."""

    spec = UpperLocal.spec.model_dump(mode="json") | {
        "execution": "activity",
        "constraints": {"timeout_seconds": 9},
    }


WORKERS = [UpperActivity]

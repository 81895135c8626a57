"""A worker process moves its startup heap out of the collector's sight, once."""

from __future__ import annotations

import subprocess
import sys

_PROBE = """
import gc
from aiworker.workers.process.worker import freeze_startup_heap
gc.collect()
assert gc.get_freeze_count() == 0
first = freeze_startup_heap()
frozen = gc.get_freeze_count()
second = freeze_startup_heap()
print(first, frozen, second, gc.get_freeze_count() == frozen)
"""


def test_the_startup_heap_is_frozen_once_per_process() -> None:
    # In a process of its own: freezing this test process would keep its objects.
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    first, frozen, second, unchanged = out
    assert first == "True" and second == "False" and unchanged == "True"
    # the imports of the worker module alone are tens of thousands of objects
    assert int(frozen) > 10_000

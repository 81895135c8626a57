"""A script that used a Temporal client exits cleanly: Core's threads leave Python first.

The SDK completes each call's Python future from one of Temporal Core's tokio
threads: the thread takes the GIL and runs ``loop.call_soon_threadsafe``, whose
``_write_to_self`` wakes the event loop with a byte on a socket, releasing the
GIL for the ``send``. The woken loop sees the answer at once, so the script's
last ``await`` returns while that thread still has to take the GIL back to
leave ``call_soon_threadsafe``. A script that ends right then (``print``,
return from ``asyncio.run``) can reach interpreter finalization first; the
tokio thread, asking for the GIL of a finalizing interpreter, is ended with
``pthread_exit``, whose unwinding through the Rust frames releases a thread
state that is not current: ``Fatal Python error: PyGILState_Release``, exit 134
(temporalio/sdk-python#300). A busy machine widens the window: a faulthandler
dump at ``atexit`` showed the tokio thread inside ``_write_to_self`` in every
crashing run of a short script.

:func:`guard_exit` (every :func:`~aiworker.workers.client.temporal_client.connect`
and :class:`~aiworker.workers.client.client.PipelineClient` calls it) registers
an ``atexit`` hook, which runs before finalization begins, while another thread
may still take the GIL: it releases the GIL until no thread outside
:mod:`threading` is inside Python code, bounded by :data:`SETTLE_SECONDS`.
The aiworker commands end with ``os._exit`` instead
(:func:`~aiworker.workers.cli.errors.exit_process`); this is for the scripts
and services users write around :class:`~aiworker.workers.client.client.PipelineClient`.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time

# Bounds the wait of a hook that cannot see why a thread stays: a native thread
# that runs Python code for its own reasons must not hold up the exit.
SETTLE_SECONDS = 5.0
# One GIL hand-over is microseconds; a loaded machine may not schedule the
# tokio thread for a few milliseconds.
_PAUSE_SECONDS = 0.001

_guarded = False
_lock = threading.Lock()


def foreign_threads_in_python() -> list[int]:
    """The idents of the threads inside Python code that :mod:`threading` does not
    know: native threads (Temporal Core's) running a callback."""
    known = {t.ident for t in threading.enumerate()}
    return [ident for ident in sys._current_frames() if ident not in known]


def settle_native_threads(timeout: float = SETTLE_SECONDS) -> bool:
    """Release the GIL until no native thread is inside Python code, for at most
    ``timeout`` seconds; whether none is."""
    deadline = time.monotonic() + timeout
    while foreign_threads_in_python():
        if time.monotonic() >= deadline:
            return False
        time.sleep(_PAUSE_SECONDS)
    return True


def guard_exit() -> None:
    """Register :func:`settle_native_threads` to run at interpreter exit, once a process."""
    global _guarded
    with _lock:
        if not _guarded:
            atexit.register(settle_native_threads)
            _guarded = True

"""The one way a test waits for something to happen: poll it, with a deadline.

Tests never assert on how long something took; they wait (bounded) until a
state is reached and then assert on the state. A wait that runs out fails
with a message naming what it awaited, not with the test's own timeout.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def wait_until(
    check: Callable[[], T | Awaitable[T]],
    what: str | Callable[[], str],
    *,
    timeout: float = 20.0,
    interval: float = 0.1,
) -> T:
    """Call ``check`` until it returns something truthy, and return that.

    Args:
        check: a function or coroutine function of no arguments; what it
            returns is the answer (``True``, or a value worth keeping).
        what: what is awaited, for the failure message ("the step to await review");
            a function is asked at the deadline, so the message can tell how far
            things got.
        timeout: seconds before giving up; ``check`` runs once more at the deadline.
        interval: seconds between two calls.

    Returns:
        The first truthy answer.

    Raises:
        AssertionError: nothing truthy came within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    while True:
        answer = check()
        if inspect.isawaitable(answer):
            answer = await answer
        if answer:
            return answer
        if time.monotonic() >= deadline:
            awaited = what if isinstance(what, str) else what()
            raise AssertionError(
                f"timed out after {timeout:g}s waiting for {awaited} (last answer: {answer!r})"
            )
        await asyncio.sleep(interval)

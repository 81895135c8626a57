"""A failure converter that survives failure details it cannot decode.

The SDK decodes a failure's details (``ApplicationError.details``, a
cancellation's details, a timeout's last heartbeat details) while it converts
the failure, before workflow code sees it. An external worker (another
process, any language) may attach a detail in an encoding this process does
not know (``binary/x-odd``, ``json/protobuf`` of a message type not linked
in); with the default converter that decode error fails the workflow task,
which Temporal retries forever: a pipeline stuck on a foreign worker's bad
output. :class:`TolerantFailureConverter` converts such a failure again
without its details and says so in the message, at every level of the cause
chain, so the workflow receives an ordinary error and fails the step.

It also keeps a failure small. Temporal keeps an activity's last failure in
the workflow's mutable state, where anything over 4 KiB is replaced by
"Failure exceeds size limit." (the type, the stable code a pipeline and the
UI read, is lost from the pending activity). Python stack traces through the
SDK's and aiworker's interceptors alone come near that, so each level of the
chain keeps only the innermost frames of its stack trace, up to
``MAX_STACK_TRACE_CHARS``; the worker's log line has the whole traceback.
"""

from __future__ import annotations

from typing import Any

from temporalio.api.failure.v1 import Failure
from temporalio.converter import DefaultFailureConverter, PayloadConverter

# Per level of a failure's cause chain: a two-level chain (the stable error and
# the exception it wraps) stays well under the server's 4 KiB for its messages,
# details and stack traces together.
MAX_STACK_TRACE_CHARS = 1000
_FRAME = "  File "


class TolerantFailureConverter(DefaultFailureConverter):
    """The default failure converter, dropping details that cannot be decoded.

    A failure whose own details fail to decode becomes the same error without
    details, its message ending in ``(details dropped: cannot decode: <reason>)``.
    Everything else, including a failure whose details decode, converts exactly
    as :class:`temporalio.converter.DefaultFailureConverter` converts it.
    """

    def to_failure(
        self, exception: BaseException, payload_converter: PayloadConverter, failure: Failure
    ) -> None:
        """See :meth:`temporalio.converter.FailureConverter.to_failure`; stack traces trimmed."""
        super().to_failure(exception, payload_converter, failure)
        level: Failure | None = failure
        while level is not None:
            level.stack_trace = trimmed_stack_trace(level.stack_trace)
            level = level.cause if level.HasField("cause") else None

    def from_failure(self, failure: Failure, payload_converter: PayloadConverter) -> BaseException:
        """See :meth:`temporalio.converter.FailureConverter.from_failure`."""
        try:
            return super().from_failure(failure, payload_converter)
        except Exception:
            # The base class converts the cause through this method, so a cause's
            # bad details are already handled there; only this level's are left.
            reason = _undecodable(failure, payload_converter)
            if reason is None:
                raise
        stripped = Failure()
        stripped.CopyFrom(failure)
        for details in _details(stripped):
            details.Clear()
        note = f"(details dropped: cannot decode: {reason})"
        stripped.message = f"{failure.message} {note}" if failure.message else note
        return super().from_failure(stripped, payload_converter)


def trimmed_stack_trace(stack: str, limit: int = MAX_STACK_TRACE_CHARS) -> str:
    """The innermost frames of ``stack`` that fit in ``limit`` characters.

    Cut at a frame's start, with a first line saying how much was left out;
    a stack that fits is returned as it is.
    """
    if len(stack) <= limit:
        return stack
    tail = stack[len(stack) - limit :]
    start = tail.find(_FRAME)
    tail = tail[start:] if start >= 0 else tail
    return f"  ... {len(stack) - len(tail)} characters of outer frames left out\n{tail}"


def _details(failure: Failure) -> list[Any]:
    """The payload lists of ``failure`` itself (not its cause) that get decoded."""
    match failure.WhichOneof("failure_info"):
        case "application_failure_info":
            return [failure.application_failure_info.details]
        case "canceled_failure_info":
            return [failure.canceled_failure_info.details]
        case "timeout_failure_info":
            return [failure.timeout_failure_info.last_heartbeat_details]
    return []


def _undecodable(failure: Failure, payload_converter: PayloadConverter) -> str | None:
    """Why ``failure``'s own details cannot be decoded, or None if they can."""
    for details in _details(failure):
        try:
            payload_converter.from_payloads_wrapper(details)
        except Exception as e:
            return _reason(e)
    return None


def _reason(e: BaseException) -> str:
    """``e`` in words, with the error it wraps (the SDK wraps a converter's own error)."""
    # KeyError's str() is the repr of its argument; the argument reads better.
    said = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
    return f"{said}: {_reason(e.__cause__)}" if e.__cause__ is not None else said

"""The failure converter every aiworker client and worker uses, on real failure protos.

The end-to-end case (an external worker's failure in a pipeline on the dev
server) is in ``tests/workflows/test_external_worker.py``; here, each level of
a cause chain and each kind of undecodable detail, through the project's own
data converter.
"""

from __future__ import annotations

from temporalio.api.common.v1 import Payload
from temporalio.api.failure.v1 import Failure
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

from aiworker.workers.client.temporal_client import data_converter
from aiworker.workers.failures import MAX_STACK_TRACE_CHARS

ODD = Payload(metadata={"encoding": b"binary/x-odd"}, data=b"?")
UNKNOWN_PROTO = Payload(
    metadata={"encoding": b"json/protobuf", "messageType": b"acme.v1.Nowhere"}, data=b"{}"
)
GOOD = Payload(metadata={"encoding": b"json/plain"}, data=b'{"code": "x"}')


def app_failure(message: str, *details: Payload, cause: Failure | None = None) -> Failure:
    f = Failure(message=message)
    f.application_failure_info.type = "upstream_error"
    f.application_failure_info.non_retryable = True
    f.application_failure_info.details.payloads.extend(details)
    if cause is not None:
        f.cause.CopyFrom(cause)
    return f


async def test_every_level_of_the_cause_chain_drops_only_its_own_bad_details() -> None:
    root = Failure(message="cancelled upstream")
    root.canceled_failure_info.details.payloads.append(UNKNOWN_PROTO)
    middle = app_failure("readable", GOOD, cause=root)
    top = Failure(message="activity failed", cause=app_failure("boom", GOOD, ODD, cause=middle))
    top.activity_failure_info.activity_type.name = "text-stats"

    err = await data_converter(None).decode_failure(top)

    assert isinstance(err, ActivityError) and err.activity_type == "text-stats"
    boom = err.cause
    assert isinstance(boom, ApplicationError)
    assert boom.message == (
        "boom (details dropped: cannot decode: Unknown payload encoding binary/x-odd)"
    )
    # the rest of the failure is kept; the good detail goes with the bad (all or none)
    assert (boom.type, boom.non_retryable, boom.details) == ("upstream_error", True, ())
    readable = boom.cause
    assert isinstance(readable, ApplicationError)
    assert (readable.message, readable.details) == ("readable", ({"code": "x"},))
    cancelled = readable.cause
    assert isinstance(cancelled, CancelledError) and cancelled.details == ()
    assert cancelled.message.startswith("cancelled upstream (details dropped: cannot decode: ")
    assert "acme.v1.Nowhere" in cancelled.message
    # the error's own proto says what the error says (a workflow re-raising it sends that)
    assert boom.failure is not None and boom.failure.message == boom.message
    # the incoming failure is not changed
    assert (
        top.cause.message == "boom"
        and len(top.cause.application_failure_info.details.payloads) == 2
    )


async def test_a_failure_without_a_message_says_only_what_was_dropped() -> None:
    err = await data_converter(None).decode_failure(app_failure("", ODD))
    assert isinstance(err, ApplicationError)
    assert err.message == "(details dropped: cannot decode: Unknown payload encoding binary/x-odd)"


async def test_failures_that_decode_convert_as_before() -> None:
    conv = data_converter(None)
    failure = Failure()
    await conv.encode_failure(ApplicationError("fine", {"a": 1}, type="invalid_input"), failure)
    err = await conv.decode_failure(failure)
    assert isinstance(err, ApplicationError)
    assert (err.message, err.type, err.details) == ("fine", "invalid_input", ({"a": 1},))


def _ping(n: int) -> None:
    # Two functions in turn: a traceback folds only repeats of the same frame.
    if n == 0:
        raise ConnectionError("upstream went away")
    _pong(n - 1)


def _pong(n: int) -> None:
    _ping(n)


async def test_a_deep_failure_keeps_its_innermost_frames_and_fits_the_servers_4_kib() -> None:
    # Temporal replaces a pending activity's last failure over 4 KiB by
    # "Failure exceeds size limit.", losing the stable code the UI and tests read.
    try:
        try:
            _ping(40)
        except ConnectionError as cause:
            raise ApplicationError(
                "circuit for host h is open", {"code": "circuit_open"}, type="circuit_open"
            ) from cause
    except ApplicationError as e:
        error = e
    conv = data_converter(None)
    failure = Failure()
    await conv.encode_failure(error, failure)
    assert failure.ByteSize() < 4096
    assert failure.application_failure_info.type == "circuit_open"
    for level in (failure, failure.cause):
        assert len(level.stack_trace) <= MAX_STACK_TRACE_CHARS + 80
    inner = failure.cause.stack_trace
    assert inner.startswith("  ... ") and "characters of outer frames left out" in inner
    assert inner.rstrip().endswith('raise ConnectionError("upstream went away")')
    err = await conv.decode_failure(failure)
    assert isinstance(err, ApplicationError) and err.type == "circuit_open"
    assert isinstance(err.__cause__, ApplicationError)
    assert err.__cause__.message == "upstream went away"


async def test_a_short_stack_trace_is_kept_whole() -> None:
    try:
        raise ApplicationError("bad", type="invalid_input")
    except ApplicationError as e:
        error = e
    failure = Failure()
    await data_converter(None).encode_failure(error, failure)
    assert "raise ApplicationError" in failure.stack_trace
    assert "left out" not in failure.stack_trace

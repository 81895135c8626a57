"""What the heartbeat details say of attempts whose outcome is unknown, and what
is booked for them (``schemas/lost_usage.py``); the paths through real workers
are tests/reliability/test_usage_lost_attempt.py and tests/workflows/test_lost_usage.py."""

from __future__ import annotations

from aiworker.schemas.lost_usage import NOTHING_HEARD, LastBeat, cover
from aiworker.schemas.protocol import Usage

E = Usage(input_tokens=50, output_tokens=200, external_calls=1)


def test_a_final_word_covers_its_attempt_and_the_later_ones_are_estimated() -> None:
    heard = Usage(input_tokens=12, output_tokens=5, external_calls=1)
    last = LastBeat.of({"usage": {}, "attempt": 1, "final": True})
    assert last is not None
    assert cover(heard, last, 1, E) == (heard, [])  # attempt 1 failed and said so
    usage, lost = cover(heard, last, 3, E)
    assert lost == [2, 3]
    assert usage == heard + E + E


def test_a_running_attempts_word_is_raised_to_the_maximum_never_counted_twice() -> None:
    before = Usage(input_tokens=12, output_tokens=5, external_calls=1)
    streamed = before + Usage(input_tokens=50, output_tokens=30, external_calls=1)
    last = LastBeat.of({"attempt": 2, "final": False, "before": before.model_dump(mode="json")})
    assert last is not None
    usage, lost = cover(streamed, last, 2, E)
    assert lost == [2]
    assert usage == before + E  # the 30 streamed tokens are within the maximum
    big = before + Usage(input_tokens=50, output_tokens=900, external_calls=1)
    assert cover(big, last, 2, E)[0].output_tokens == 905  # more than the maximum: kept


def test_nothing_heard_estimates_every_attempt_and_old_details_are_trusted() -> None:
    assert cover(Usage(), NOTHING_HEARD, 2, E) == (E + E, [1, 2])
    assert LastBeat.of({"usage": {"input_tokens": 3}}) is None  # a worker before the marks
    assert LastBeat.of({"attempt": True}) is None

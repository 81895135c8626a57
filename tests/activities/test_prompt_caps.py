"""A prompt template that repeats a large input is refused, not built (issue 15, item 4)."""

from __future__ import annotations

import pytest

from aiworker.activities.errors import PayloadTooLargeError
from aiworker.activities.prompt import render
from aiworker.schemas.errors import ErrorCode


def test_a_template_repeating_a_large_input_is_payload_too_large() -> None:
    template = " ".join(["${{ input.text }}"] * 99)
    text = "x" * (1024 * 1024)
    with pytest.raises(PayloadTooLargeError) as caught:
        render(template, {"text": text})  # the default cap: 16 MiB
    assert caught.value.code == ErrorCode.PAYLOAD_TOO_LARGE
    assert "AIWORKER_MAX_RESOLVED_BYTES" in str(caught.value)
    assert len(render(template, {"text": "x" * 1000})) == 99 * 1000 + 98
    with pytest.raises(PayloadTooLargeError):
        render(template, {"text": "x" * 1000}, max_chars=50_000)

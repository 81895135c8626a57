"""What ``aiworker run`` shows of a streaming step: pure renderers of the running
attempt's heartbeat details (``{"step", "partial_text", "chars", "tokens", "usage"}``)."""

from __future__ import annotations

import io

from aiworker.workers.client.progress import (
    Snapshot,
    progress_line,
    stream_events,
    stream_of,
    stream_text,
)
from aiworker.workers.client.watch import STREAM_LINE_SECONDS, PlainView

PROGRESS = {
    "status": "running",
    "steps": {
        "fetch": {"status": "succeeded", "attempts": 1, "duration_ms": 80.0},
        "summarize": {"status": "running", "attempts": 1},
        "save": {"status": "running", "attempts": 1},
    },
}
USAGE = {"input_tokens": 312, "output_tokens": 84, "external_calls": 1}
TEXT = "Pour slowly, in circles, and stop when the bloom settles: the kettle is a gooseneck"


def details(text: str = TEXT, tokens: int = 84, chars: int | None = None) -> dict[str, object]:
    return {
        "step": "summarize",
        "partial_text": text,
        "chars": len(text) if chars is None else chars,
        "tokens": tokens,
        "usage": USAGE,
    }


def test_the_live_line_quotes_the_end_of_a_streaming_reply() -> None:
    snap = Snapshot.of(PROGRESS, streams={"summarize": details()})
    assert progress_line("tea", snap, 2.04) == (
        "⠋ tea  1/3 steps · running: save · "
        'summarize: 84 tokens "…the kettle is a gooseneck" · 2.0s'
    )
    assert progress_line("tea", snap, 2.04, ascii_only=True).endswith(
        'summarize: 84 tokens "...the kettle is a gooseneck" - 2.0s'
    )
    # a short reply is quoted whole; one token is one token; newlines stay on one line
    short = Snapshot.of(PROGRESS, streams={"summarize": details("The\nkettle", tokens=1)})
    assert 'summarize: 1 token "The kettle"' in progress_line("tea", short, 1)
    # the heartbeat holds a tail only: the line says the text was cut
    tail = details("…is a gooseneck", chars=5000)
    assert stream_text("summarize", tail) == 'summarize: 84 tokens "…is a gooseneck"'
    # no streams: the line is what it was
    assert "running: summarize, save" in progress_line("tea", Snapshot.of(PROGRESS), 1)


def test_plain_lines_tell_a_growing_stream_and_not_a_still_one() -> None:
    one = Snapshot.of(PROGRESS, streams={"summarize": details("Pour slowly", tokens=3)})
    two = Snapshot.of(PROGRESS, streams={"summarize": details()})
    assert stream_events(None, one) == ['summarize: 3 tokens "Pour slowly"']
    assert stream_events(one, two) == ['summarize: 84 tokens "…the kettle is a gooseneck"']
    assert stream_events(two, two) == []


def test_the_plain_view_says_a_stream_at_most_every_few_seconds() -> None:
    out = io.StringIO()
    view = PlainView(out, "tea")
    first = Snapshot.of(PROGRESS, streams={"summarize": details("Pour", tokens=1)})
    view.update(first, 1.0)
    view.update(Snapshot.of(PROGRESS, streams={"summarize": details("Pour slowly", 3)}), 2.0)
    view.update(Snapshot.of(PROGRESS, streams={"summarize": details()}), 1.0 + STREAM_LINE_SECONDS)
    said = [line for line in out.getvalue().splitlines() if "token" in line]
    assert said == [
        '[   1.0s] summarize: 1 token "Pour"',
        '[   6.0s] summarize: 84 tokens "…the kettle is a gooseneck"',
    ]


def test_stream_of_picks_the_streaming_details_and_nothing_else() -> None:
    assert stream_of([details()]) == details()
    assert stream_of([{"usage": USAGE}]) is None  # a failed attempt's usage hand-over
    assert stream_of([]) is None
    assert stream_of(["text", {"partial_text": 3, "chars": 1}]) is None

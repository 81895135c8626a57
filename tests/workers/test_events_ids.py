"""The live event stream's pure parts: ids and their cursor, frames, which step
row change is which event, and the events query's window."""

from __future__ import annotations

import pytest

from aiworker.workers.client.events import Cursor, Event
from aiworker.workers.frontdoor.events import frame
from aiworker.workflows.details import Row
from aiworker.workflows.step_events import MAX_ANSWER, StepEvents, kind_of


def test_an_id_is_its_cursor_and_back() -> None:
    assert Cursor.parse(None) == Cursor() and Cursor.parse("  ") == Cursor()
    assert Cursor.parse("7.1732801234567890") == Cursor(7, 1732801234567890)
    assert Cursor(7, 12).id() == "7.12"
    assert Cursor.parse("end").ended and Cursor(ended=True).id() == "end"
    for bad in ("7", "x.1", "1.-2", "1.2.3", "1." + "9" * 50, "\u0661.1"):
        with pytest.raises(ValueError, match="not an event id"):
            Cursor.parse(bad)


def test_a_frame_is_an_id_a_type_and_one_line_of_json() -> None:
    event = Event("3.0", "step_ended", {"step": "a\nb", "text": "é"})
    assert frame(event) == (
        'id: 3.0\nevent: step_ended\ndata: {"step":"a\\nb","text":"é"}\n\n'.encode()
    )


def test_which_row_change_is_which_event() -> None:
    def row(status: str, attempts: int = 0, done: int | None = None) -> Row:
        return (status, attempts, False, done, 10 if done is not None else None)

    assert kind_of(None, row("pending")) is None
    assert kind_of(None, row("running")) == "step_started"
    assert kind_of(row("running"), row("running", 1)) == "step_progress"
    assert kind_of(row("running", 1, 2), row("running", 1, 3)) == "step_progress"
    assert kind_of(row("running", 1), row("running", 1)) is None
    assert kind_of(row("running", 1), row("awaiting_review", 1)) == "review_awaited"
    assert kind_of(row("awaiting_review", 1), row("running", 1)) == "step_started"
    assert kind_of(row("running", 1), row("succeeded", 1)) == "step_ended"
    assert kind_of(None, row("skipped")) == "step_ended"  # never ran: ended at once
    # a wait step waits for its callback (for_each: its tokens' items move)
    assert kind_of(None, row("waiting")) == "step_started"
    assert kind_of(row("waiting", 0, 1), row("waiting", 0, 2)) == "step_progress"
    assert kind_of(row("waiting"), row("succeeded")) == "step_ended"


def test_the_events_query_answers_after_a_number_within_what_is_kept() -> None:
    log = StepEvents(run_id=None)
    log.kept = [{"n": n, "type": "step_progress"} for n in range(101, 101 + 2 * MAX_ANSWER)]
    log.count = 100 + 2 * MAX_ANSWER
    first = log.answer(0, "running")
    assert first["first"] == 101 and first["count"] == log.count
    assert [e["n"] for e in first["events"]] == list(range(101, 101 + MAX_ANSWER))
    assert [e["n"] for e in log.answer(150, "running")["events"]][:2] == [151, 152]
    assert log.answer(log.count, "succeeded") == {
        "events": [],
        "count": log.count,
        "first": 101,
        "status": "succeeded",
    }

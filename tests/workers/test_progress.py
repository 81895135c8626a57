"""The renderers of ``aiworker run``'s output: the live line, the plain lines and
the summary table are pure functions of what they show."""

from __future__ import annotations

import json
from collections import Counter

from aiworker.workers.client.progress import (
    OUTPUT_CHARS,
    Snapshot,
    Wait,
    output_lines,
    progress_line,
    step_events,
    summary,
    ui_base,
    workflow_link,
)

PROGRESS = {
    "status": "running",
    "steps": {
        "fetch": {"status": "waiting", "attempts": 0},
        "each": {"status": "running", "attempts": 1, "items": {"total": 100, "done": 40}},
        "check": {"status": "succeeded", "attempts": 1, "duration_ms": 412.0},
    },
    "waiting": {"fetch": "rate"},
    "awaiting_review": [],
}


def test_live_line_shows_steps_items_waits_and_time() -> None:
    waits: Counter[Wait] = Counter({("fetch", "rate", False): 1})
    snap = Snapshot.of(PROGRESS, waits)
    assert progress_line("hello", snap, 3.21) == (
        "⠋ hello  1/3 steps · for_each 40/100 items · waiting: fetch at rate limit · 3.2s"
    )
    # the spinner turns; ASCII terminals get ASCII; a narrow one a cut line
    assert progress_line("hello", snap, 3.2, frame=1).startswith("⠙ hello")
    assert progress_line("hello", snap, 3.2, frame=1, ascii_only=True) == (
        "/ hello  1/3 steps - for_each 40/100 items - waiting: fetch at rate limit - 3.2s"
    )
    cut = progress_line("hello", snap, 3.2, width=20)
    assert len(cut) == 20 and cut.endswith("…")


def test_live_line_before_the_first_answer_and_without_waits() -> None:
    assert progress_line("hello", None, 0.04) == "⠋ hello  starting · 0.0s"
    items_wait: Counter[Wait] = Counter({("each", "concurrency", True): 3})
    running = Snapshot.of({"steps": {"each": {"status": "running"}}}, items_wait)
    assert progress_line("p", running, 1) == (
        "⠋ p  0/1 steps · waiting: each (3 items) for a concurrency slot · 1.0s"
    )
    review = Snapshot.of({"steps": {"a": {"status": "awaiting_review"}}, "awaiting_review": ["a"]})
    assert progress_line("p", review, 1).endswith("awaiting review: a · 1.0s")
    assert progress_line("p", Snapshot.of(PROGRESS), 1) == (
        "⠋ p  1/3 steps · for_each 40/100 items · running: each · 1.0s"
    )


def test_plain_lines_say_each_status_change_once() -> None:
    first = Snapshot.of(PROGRESS)
    assert step_events(None, first) == [
        "fetch: waiting",
        "each: running",
        "check: succeeded (1 attempt, 0.41s)",
    ]
    assert step_events(first, first) == []
    later = Snapshot.of(
        {
            "steps": {
                **PROGRESS["steps"],  # type: ignore[dict-item]
                "fetch": {"status": "failed", "attempts": 3, "error_code": "fetch_failed"},
                "each": {
                    "status": "partial",
                    "duration_ms": 2500,
                    "items": {"total": 100, "succeeded": 98, "failed": 2},
                },
            }
        }
    )
    assert step_events(first, later) == [
        "fetch: failed (3 attempts, 0.00s, fetch_failed)",
        "each: partial (100/100 items, 2.50s)",
    ]


def test_summary_is_a_short_table_with_output_error_and_link() -> None:
    doc = {
        "workflow_id": "hello-1",
        "status": "partial",
        "output": {"title": "x" * 400},  # cut to one line
        "steps": {
            "fetch": {"status": "succeeded", "attempts": 1, "duration_ms": 812.5},
            "each": {
                "status": "partial",
                "attempts": 2,
                "duration_ms": 12000,
                "items": {"total": 10, "succeeded": 9, "failed": 1},
                "cached": True,
            },
        },
        "error": {"code": "not_found", "message": "1 of 10 items failed", "step": "each"},
    }
    text = summary(
        doc,
        name="hello",
        workers={"fetch": "web-scrape", "each": "web-scrape"},
        elapsed=13.04,
        link="http://ui/w",
    )
    lines = text.splitlines()
    assert lines[:4] == [
        "hello partial in 13.0s",
        "  step   worker      status                        attempts  duration",
        "  fetch  web-scrape  succeeded                            1     0.81s",
        "  each   web-scrape  partial (cached) 10/10 items         2    12.00s",
    ]
    assert lines[4].startswith('output.title: "xxx') and lines[4].endswith(
        "…  (--field title prints it whole)"
    )
    assert lines[5:] == [
        "error: not_found: 1 of 10 items failed (step each)",
        "workflow: hello-1  http://ui/w",
    ]


def test_output_shows_asked_fields_whole_and_cuts_the_rest() -> None:
    short = {"title": "t", "n": 2}
    assert output_lines(short) == ['output: {"title": "t", "n": 2}']
    assert output_lines({}) == []
    long = {"markdown": "# a\n" + "m" * 400, "summary": "s" * 50, "tags": ["x"] * 80}
    cut = output_lines(long)
    assert cut[0].startswith('output.markdown: "# a\\nmmm') and cut[0].endswith(
        "…  (--field markdown prints it whole)"
    )
    assert len(cut[0]) <= len("output.markdown: ") + OUTPUT_CHARS + len(
        "  (--field markdown prints it whole)"
    )
    assert cut[1] == f'output.summary: "{"s" * 50}"'  # a short field beside a long one: whole
    assert cut[2].endswith("…  (--field tags prints it whole)")
    asked = output_lines(long, ["markdown", "tags"])
    assert asked[0] == "output.markdown:\n# a\n" + "m" * 400  # its text, lines kept
    assert asked[2] == "output.tags: " + json.dumps(["x"] * 80)
    assert output_lines(short, ["title"]) == ["output.title: t", "output.n: 2"]


def test_ui_link_from_the_setting_or_the_dev_default() -> None:
    assert ui_base(None, "localhost:7233") == "http://localhost:8233"
    assert ui_base(None, "temporal.prod:7233") is None
    assert ui_base("https://ui.example/", "x:7233") == "https://ui.example/"
    assert workflow_link("https://ui.example/", "team a", "p/1") == (
        "https://ui.example/namespaces/team%20a/workflows/p/1"
    )
    assert workflow_link(None, "default", "p") is None


def test_live_line_shows_wait_steps_awaiting_their_callback() -> None:
    progress = {
        "status": "running",
        "steps": {
            "sign": {"status": "waiting", "attempts": 0},
            "each": {"status": "waiting", "attempts": 0, "items": {"total": 3, "done": 1}},
        },
        "awaiting_callback": [
            {"step": "sign", "state": "waiting", "timeout_at": "2026-11-28T16:00:00+00:00"},
            {"step": "each", "item": 0, "state": "waiting"},
            {"step": "each", "item": 2, "state": "waiting"},
        ],
    }
    line = progress_line("sign-flow", Snapshot.of(progress), 1.0)
    assert "awaiting callback: sign, each (2 tokens)" in line

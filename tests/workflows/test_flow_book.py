"""The flow workflow's decisions (workflows/flow_book.py), without a server: a start
and the workflow's time in, the caller's answer and the runs to start out."""

from __future__ import annotations

from typing import Any

import pytest

from aiworker.schemas.flow import Flow
from aiworker.schemas.flow_state import (
    MAX_COLLECTED_STARTS,
    MAX_PENDING_BYTES,
    MAX_QUEUED_RUNS,
    MAX_REMEMBERED_ANSWERS,
    FlowRequest,
    FlowState,
)
from aiworker.workflows.flow_book import FlowBook

FLOW_ID = "flow/acme/p/c1"
T0 = 1_800_000_000.0


def pipeline(flow: dict[str, Any], **inputs: Any) -> dict[str, Any]:
    return {
        "name": "p",
        "tenant": "acme",
        "inputs": {"customer": "c1", **inputs},
        "steps": [],
        "flow": {"key": "${{ inputs.customer }}", **flow},
    }


def request(flow: dict[str, Any], **inputs: Any) -> FlowRequest:
    return FlowRequest(pipeline=pipeline(flow, **inputs), key="c1")


def book(flow: dict[str, Any]) -> FlowBook:
    decl = Flow.model_validate({"key": "${{ inputs.customer }}", **flow})
    state = FlowState(tenant="acme", pipeline="p", key="c1", flow=decl)
    return FlowBook(state, FLOW_ID, "g1")


DEBOUNCE = {"debounce": {"seconds": 10, "max_wait_seconds": 60}}


def test_debounce_collapses_close_starts_into_one_run_with_the_last_input() -> None:
    b = book(DEBOUNCE)
    first = b.submit(request(DEBOUNCE, n=1), T0)
    assert first.answer.status == "queued" and first.launch is None
    assert first.answer.workflow_id == f"{FLOW_ID}/g1-1"
    assert first.answer.starts_at == T0 + 10
    assert "quiet 10 s" in first.answer.reason
    second = b.submit(request(DEBOUNCE, n=2), T0 + 5)
    assert second.answer.status == "collapsed"
    assert second.answer.workflow_id == first.answer.workflow_id
    assert second.answer.starts == 2
    assert second.answer.reason.endswith("; 2 starts so far")
    assert b.wake_at(T0 + 5) == T0 + 15  # quiet again from the latest start
    assert b.due(T0 + 14.9) == []
    [launch] = b.due(T0 + 15)
    assert launch.run.workflow_id == f"{FLOW_ID}/g1-1"
    assert launch.pipeline["inputs"] == {"customer": "c1", "n": 2}
    assert "2 starts" in launch.summary
    # the next start opens a new run
    third = b.submit(request(DEBOUNCE, n=3), T0 + 16)
    assert third.answer.status == "queued" and third.answer.workflow_id == f"{FLOW_ID}/g1-2"


def test_debounce_max_wait_forces_a_start_however_busy_the_key() -> None:
    b = book(DEBOUNCE)
    t = T0
    b.submit(request(DEBOUNCE, n=0), t)
    for n in range(1, 12):  # a start every 5 s: never quiet 10 s
        t += 5
        assert b.due(t) == []
        assert b.submit(request(DEBOUNCE, n=n), t).answer.status == "collapsed"
    assert b.wake_at(t) == T0 + 60
    [launch] = b.due(T0 + 60)
    assert launch.pipeline["inputs"]["n"] == 11


def test_debounce_without_max_wait_waits_for_quiet_only() -> None:
    flow = {"debounce": {"seconds": 10}}
    b = book(flow)
    for n in range(20):
        b.submit(request(flow, n=n), T0 + 5 * n)
    assert b.wake_at(T0 + 95) == T0 + 105


def test_debounce_all_gives_every_input_oldest_first_as_starts() -> None:
    flow = {"debounce": {"seconds": 10, "inputs": "all"}}
    b = book(flow)
    for n in range(3):
        b.submit(request(flow, n=n), T0 + n)
    [launch] = b.due(T0 + 12)
    inputs = launch.pipeline["inputs"]
    assert inputs["n"] == 2  # the last start's inputs, and every start's as `starts`
    assert [s["n"] for s in inputs["starts"]] == [0, 1, 2]


def test_debounce_all_starts_at_the_collection_cap() -> None:
    flow = {"debounce": {"seconds": 10, "inputs": "all"}}
    b = book(flow)
    for n in range(MAX_COLLECTED_STARTS - 1):
        assert b.submit(request(flow, n=n), T0).launch is None
    last = b.submit(request(flow, n=-1), T0)
    assert last.answer.status == "started" and last.launch is not None
    assert len(last.launch.pipeline["inputs"]["starts"]) == MAX_COLLECTED_STARTS
    assert b.pending == []


def test_a_changed_mode_is_refused_while_a_run_is_pending() -> None:
    b = book(DEBOUNCE)
    b.submit(request(DEBOUNCE), T0)
    other = request({"singleton": "wait"})
    why = b.refusal(other, T0 + 1)
    assert why is not None and "changed from debounce to singleton:wait" in why
    # changed numbers of the same mode are taken
    assert b.refusal(request({"debounce": {"seconds": 30}}), T0 + 1) is None
    b.due(T0 + 100)
    assert b.refusal(other, T0 + 101) is None


def test_a_start_past_the_bytes_held_is_refused() -> None:
    b = book(DEBOUNCE)
    big = "x" * (MAX_PENDING_BYTES // 2)
    b.submit(request(DEBOUNCE, blob=big), T0)
    why = b.refusal(request(DEBOUNCE, blob=big + "y"), T0 + 1)
    assert why is not None and "bytes" in why


def test_a_start_for_another_key_is_refused() -> None:
    b = book(DEBOUNCE)
    why = b.refusal(FlowRequest(pipeline=pipeline(DEBOUNCE), key="c2"), T0)
    assert why is not None and "'c2'" in why


def test_the_state_carries_what_is_pending_across_continue_as_new() -> None:
    b = book(DEBOUNCE)
    b.submit(request(DEBOUNCE, n=1), T0)
    b.submit(request(DEBOUNCE, n=2), T0 + 1)
    again = FlowBook(FlowState.model_validate(b.state().model_dump()), FLOW_ID, "other")
    assert again.generation == "g1"  # ids never repeat within a chain
    assert again.submit(request(DEBOUNCE, n=3), T0 + 2).answer.status == "collapsed"
    [launch] = again.due(T0 + 12)
    assert launch.pipeline["inputs"]["n"] == 3
    assert again.submit(request(DEBOUNCE), T0 + 20).answer.workflow_id == f"{FLOW_ID}/g1-2"
    assert again.counts == {"started": 1, "collapsed": 2, "queued": 2}


def test_answers_are_remembered_by_update_id_across_continue_as_new() -> None:
    b = book(DEBOUNCE)
    first = b.submit(request(DEBOUNCE, n=1), T0).answer
    b.remember("u-1", first)
    for i in range(MAX_REMEMBERED_ANSWERS + 5):  # only the latest are kept
        b.remember(f"later-{i}", first)
    assert b.answer_of("u-1") is None and len(b.answered) == MAX_REMEMBERED_ANSWERS
    b.remember("u-2", first)
    again = FlowBook(FlowState.model_validate(b.state().model_dump()), FLOW_ID, "other")
    assert again.answer_of("u-2") == first
    assert again.answer_of(None) is None and again.answer_of("never") is None
    again.remember(None, first)  # a start without an id is not remembered
    assert len(again.answered) == MAX_REMEMBERED_ANSWERS


@pytest.mark.parametrize("now", [T0, T0 + 100])
def test_details_name_the_mode_and_the_next_run(now: float) -> None:
    b = book(DEBOUNCE)
    b.submit(request(DEBOUNCE), T0)
    text = b.details(now)
    assert "**flow** debounce" in text
    assert f"`{FLOW_ID}/g1-1`" in text and "starts at 2027-01-15" in text


WAIT = {"singleton": "wait"}
CANCEL = {"singleton": "cancel_running"}


def test_singleton_wait_starts_one_run_and_queues_the_rest_in_order() -> None:
    b = book(WAIT)
    first = b.submit(request(WAIT, n=1), T0)
    assert first.answer.status == "started" and first.launch is not None
    assert b.running == first.answer.workflow_id
    second = b.submit(request(WAIT, n=2), T0 + 1)
    third = b.submit(request(WAIT, n=3), T0 + 2)
    assert (second.answer.status, second.answer.behind) == ("queued", first.answer.workflow_id)
    assert (third.answer.status, third.answer.behind) == ("queued", second.answer.workflow_id)
    assert "after 1 other queued start" in third.answer.reason
    assert second.launch is None and second.cancel is None
    assert b.due(T0 + 100) == [] and b.wake_at(T0 + 100) is None  # only a close moves it
    b.closed("someone-else")
    assert b.due(T0 + 100) == []
    b.closed(first.answer.workflow_id)
    [launch] = b.due(T0 + 101)
    assert launch.run.workflow_id == second.answer.workflow_id
    assert launch.pipeline["inputs"]["n"] == 2  # each queued start runs with its own inputs
    assert b.running == second.answer.workflow_id and b.due(T0 + 102) == []
    b.closed(second.answer.workflow_id)
    [launch] = b.due(T0 + 103)
    assert launch.pipeline["inputs"]["n"] == 3
    b.closed(third.answer.workflow_id)
    assert b.idle(T0 + 104)


def test_singleton_wait_refuses_past_the_queue_bound() -> None:
    b = book(WAIT)
    b.submit(request(WAIT), T0)
    for _ in range(MAX_QUEUED_RUNS):
        assert b.refusal(request(WAIT), T0) is None
        b.submit(request(WAIT), T0)
    why = b.refusal(request(WAIT), T0)
    assert why is not None and f"{MAX_QUEUED_RUNS} runs of key 'c1' are queued" in why


def test_singleton_cancel_running_cancels_once_and_the_latest_start_runs_next() -> None:
    b = book(CANCEL)
    first = b.submit(request(CANCEL, n=1), T0)
    running = first.answer.workflow_id
    second = b.submit(request(CANCEL, n=2), T0 + 1)
    assert second.answer.status == "queued" and second.cancel == running
    assert second.answer.behind == running and "asked to cancel" in second.answer.reason
    third = b.submit(request(CANCEL, n=3), T0 + 2)
    # no second cancel; the next run takes the latest start's pipeline
    assert third.answer.status == "collapsed" and third.cancel is None
    assert third.answer.workflow_id == second.answer.workflow_id and third.answer.starts == 2
    assert b.due(T0 + 3) == []
    b.closed(running)
    [launch] = b.due(T0 + 4)
    assert launch.run.workflow_id == second.answer.workflow_id
    assert launch.pipeline["inputs"]["n"] == 3
    # the next start cancels the new running run
    fourth = b.submit(request(CANCEL, n=4), T0 + 5)
    assert fourth.cancel == second.answer.workflow_id


THROTTLE = {"throttle": {"max_starts": 2, "period_seconds": 60}}


def test_a_throttle_with_an_empty_window_has_nothing_to_wake_for() -> None:
    """Before any start, and once every start left the period (its window pruned):
    no time to wake at, never an index into the empty window (found by
    test_cross_build.py: a flow workflow started before its first start failed its
    workflow task)."""
    b = book(THROTTLE)
    assert b.wake_at(T0) is None
    b.submit(request(THROTTLE, n=0), T0)
    assert b.wake_at(T0 + 1) == T0 + 60
    b.idle(T0 + 100)  # prunes the window
    assert b.wake_at(T0 + 100) is None


def test_throttle_starts_at_most_n_per_period_and_queues_the_rest_in_order() -> None:
    b = book(THROTTLE)
    answers = [b.submit(request(THROTTLE, n=n), T0 + n) for n in range(5)]
    assert [a.answer.status for a in answers] == [
        "started",
        "started",
        "queued",
        "queued",
        "queued",
    ]
    assert [a.launch is not None for a in answers] == [True, True, False, False, False]
    # each queued start takes the slot the start two before it frees, a period later
    assert [a.answer.starts_at for a in answers[2:]] == [T0 + 60, T0 + 61, T0 + 120]
    assert "throttle: 2 starts per 60 s" in answers[2].answer.reason
    assert "after 2 other queued starts" in answers[4].answer.reason
    assert b.wake_at(T0 + 5) == T0 + 60
    assert b.due(T0 + 59.9) == []
    [third] = b.due(T0 + 60)
    assert third.run.workflow_id == answers[2].answer.workflow_id
    assert third.pipeline["inputs"]["n"] == 2  # each queued start runs with its own inputs
    [fourth] = b.due(T0 + 61)
    assert fourth.run.workflow_id == answers[3].answer.workflow_id
    assert b.due(T0 + 119) == []
    [fifth] = b.due(T0 + 120)
    assert fifth.run.workflow_id == answers[4].answer.workflow_id
    assert not b.idle(T0 + 150)  # the window still counts the last starts
    assert b.idle(T0 + 181)


def test_throttle_a_start_after_a_quiet_period_starts_at_once() -> None:
    b = book(THROTTLE)
    b.submit(request(THROTTLE), T0)
    b.submit(request(THROTTLE), T0)
    assert b.submit(request(THROTTLE), T0 + 60).answer.status == "started"


def test_throttle_refuses_past_the_queue_bound_never_drops() -> None:
    flow = {"throttle": {"max_starts": 1, "period_seconds": 3600}}
    b = book(flow)
    b.submit(request(flow), T0)
    for _ in range(MAX_QUEUED_RUNS):
        b.submit(request(flow), T0)
    why = b.refusal(request(flow), T0)
    assert why is not None and "queued already" in why
    started = sum(len(b.due(T0 + 3600 * k)) for k in range(1, MAX_QUEUED_RUNS + 1))
    assert started == MAX_QUEUED_RUNS and b.pending == []


BATCH = {"batch": {"max_items": 3, "max_seconds": 60}}


def test_batch_starts_one_run_at_max_items_with_every_start() -> None:
    b = book(BATCH)
    answers = [b.submit(request(BATCH, n=n), T0 + n) for n in range(3)]
    assert [a.answer.status for a in answers] == ["queued", "collapsed", "started"]
    assert {a.answer.workflow_id for a in answers} == {f"{FLOW_ID}/g1-1"}
    assert answers[0].answer.starts_at == T0 + 60
    assert "batch: starts at 3 starts" in answers[0].answer.reason
    launch = answers[2].launch
    assert launch is not None and answers[0].launch is None and answers[1].launch is None
    assert [s["n"] for s in launch.pipeline["inputs"]["starts"]] == [0, 1, 2]
    assert "started now with 3 starts" in answers[2].answer.reason
    assert b.pending == [] and b.due(T0 + 1000) == []
    assert b.submit(request(BATCH), T0 + 4).answer.workflow_id == f"{FLOW_ID}/g1-2"


def test_batch_starts_at_its_deadline_with_what_it_has() -> None:
    b = book(BATCH)
    b.submit(request(BATCH, n=0), T0)
    b.submit(request(BATCH, n=1), T0 + 50)  # a later start does not move the deadline
    assert b.wake_at(T0 + 50) == T0 + 60
    assert b.due(T0 + 59) == []
    [launch] = b.due(T0 + 60)
    assert [s["n"] for s in launch.pipeline["inputs"]["starts"]] == [0, 1]


def test_the_bytes_held_follow_the_starts_and_the_launches() -> None:
    """The bound counts what is held now: a collected start adds its inputs, a
    started run frees its pipeline and its collection."""
    flow = {"batch": {"max_items": 3, "max_seconds": 60}}
    b = book(flow)
    quarter = "x" * (MAX_PENDING_BYTES // 4)
    b.submit(request(flow, blob=quarter), T0)
    b.submit(request(flow, blob=quarter), T0)
    why = b.refusal(request(flow, blob=quarter), T0)
    assert why is not None and "bytes" in why  # two pipelines' worth plus two collected
    b.submit(request(flow, blob="small"), T0)  # the third start fills the batch: it starts
    assert b.pending == [] and b.refusal(request(flow, blob=quarter), T0) is None

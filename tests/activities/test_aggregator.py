"""The aggregator's merge policies, run through the worker runtime (contracts included)."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from aiworker.activities.aggregator import Aggregator
from aiworker.activities.runtime import WorkerRuntime
from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings
from aiworker.schemas.protocol import WorkerResponse


def _rt(settings: Settings) -> WorkerRuntime:
    return WorkerRuntime(settings, load_specs())


async def _agg(settings: Settings, **worker_input: Any) -> WorkerResponse:
    request = {"worker_id": "aggregator", "idempotency_key": "t/agg", "input": worker_input}
    return await _rt(settings).run(Aggregator(), request)


async def _agg_error(settings: Settings, **worker_input: Any) -> ApplicationError:
    with pytest.raises(ApplicationError) as e:
        await _agg(settings, **worker_input)
    return e.value


async def test_all_returns_every_branch(settings: Settings) -> None:
    r = await _agg(settings, policy="all", branches={"a": {"x": 1}, "b": {"x": 2}})
    assert r.status == "succeeded"
    assert r.outputs["result"] == {"a": {"x": 1}, "b": {"x": 2}}
    assert r.outputs["used"] == ["a", "b"]


async def test_all_fails_naming_the_failed_branch(settings: Settings) -> None:
    err = await _agg_error(settings, policy="all", branches={"a": {"x": 1}, "b": None})
    assert err.type == "validation_failed"
    assert "'b'" in err.message
    assert err.details[0]["reasons"] == [{"branch": "b", "message": "no result"}]


async def test_first_success_skips_failed_branches_with_a_warning(settings: Settings) -> None:
    r = await _agg(settings, policy="first_success", branches=[None, {"v": 2}, {"v": 3}])
    assert r.outputs["result"] == {"v": 2}
    assert r.outputs["used"] == ["1"]
    assert r.status == "partial"
    assert [(w.code, w.field) for w in r.warnings] == [("branch_failed", "0")]


async def test_first_success_with_no_success_fails(settings: Settings) -> None:
    err = await _agg_error(settings, policy="first_success", branches=[None, None])
    assert err.type == "validation_failed"


async def test_majority_vote_on_a_field_warns_about_dissent(settings: Settings) -> None:
    branches = {
        "m1": {"label": "cat", "score": 0.9},
        "m2": {"label": "dog", "score": 0.8},
        "m3": {"label": "cat", "score": 0.7},
    }
    r = await _agg(settings, policy="majority", branches=branches, field="label")
    assert r.outputs["result"] == "cat"
    assert r.outputs["used"] == ["m1", "m3"]
    assert r.outputs["votes"] == {'"cat"': 2, '"dog"': 1}
    (w,) = r.warnings
    assert w.code == "branch_disagrees"
    assert "'m2'" in w.message and "'m1'" in w.message and "'m3'" in w.message


async def test_majority_without_a_majority_fails(settings: Settings) -> None:
    branches = {"a": {"l": 1}, "b": {"l": 2}, "c": {"l": 3}, "d": None}
    err = await _agg_error(settings, policy="majority", branches=branches, field="l")
    assert err.type == "validation_failed"
    assert "1 of 3" in err.message


async def test_quorum_counts_votes(settings: Settings) -> None:
    branches = [{"l": "x"}, {"l": "y"}, {"l": "x"}, {"l": "z"}]
    r = await _agg(settings, policy="quorum", quorum=2, branches=branches, field="l")
    assert r.outputs["result"] == "x"
    err = await _agg_error(settings, policy="quorum", quorum=3, branches=branches, field="l")
    assert err.type == "validation_failed"
    err = await _agg_error(settings, policy="quorum", branches=branches, field="l")
    assert err.type == "invalid_input"


async def test_merge_prefer_first_reports_conflicts(settings: Settings) -> None:
    branches = {
        "shop": {"title": "Mug", "price": 9, "meta": {"lang": "en", "a": 1}},
        "feed": {"title": "Mug", "price": 10, "meta": {"lang": "de", "b": 2}},
    }
    r = await _agg(settings, policy="merge", branches=branches)
    assert r.outputs["result"] == {
        "title": "Mug",
        "price": 9,
        "meta": {"lang": "en", "a": 1, "b": 2},
    }
    keys = [c["key"] for c in r.outputs["conflicts"]]
    assert keys == ["price", "meta.lang"]
    assert all(w.code == "merge_conflict" for w in r.warnings)
    assert "'shop'" in r.warnings[0].message and "'feed'" in r.warnings[0].message


async def test_merge_prefer_majority(settings: Settings) -> None:
    branches = {"a": {"p": 1}, "b": {"p": 2}, "c": {"p": 2}}
    r = await _agg(settings, policy="merge", conflict="prefer_majority", branches=branches)
    assert r.outputs["result"] == {"p": 2}
    assert r.outputs["conflicts"][0]["chosen"] == "b"


async def test_merge_conflict_error(settings: Settings) -> None:
    branches = {"a": {"p": 1}, "b": {"p": 2}}
    err = await _agg_error(settings, policy="merge", conflict="error", branches=branches)
    assert err.type == "validation_failed"
    assert "'p'" in err.message and "a, b" in err.message
    err = await _agg_error(settings, policy="merge", branches={"a": [1]})
    assert err.type == "invalid_input"


async def test_concat_with_dedupe_key(settings: Settings) -> None:
    branches = {
        "p1": {"items": [{"id": 1, "n": "a"}, {"id": 2, "n": "b"}]},
        "p2": {"items": [{"id": 2, "n": "b"}, {"id": 3, "n": "c"}, {"id": 1, "n": "A"}]},
    }
    r = await _agg(settings, policy="concat", branches=branches, field="items", dedupe_key="id")
    assert [i["id"] for i in r.outputs["result"]] == [1, 2, 3]
    assert r.outputs["duplicates_removed"] == 2
    (w,) = r.warnings
    assert w.code == "duplicate_differs" and "'p2'" in w.message and "'p1'" in w.message


async def test_concat_without_dedupe_and_non_list(settings: Settings) -> None:
    r = await _agg(settings, policy="concat", branches=[[1, 2], [2]])
    assert r.outputs["result"] == [1, 2, 2]
    err = await _agg_error(settings, policy="concat", branches=[[1], {"x": 1}])
    assert err.type == "invalid_input"


async def test_unknown_policy_is_invalid_input(settings: Settings) -> None:
    err = await _agg_error(settings, policy="average", branches=[1])
    assert err.type == "invalid_input"


async def test_a_vote_on_a_path_with_a_superscript_digit_finds_no_field_instead_of_crashing(
    settings: Settings,
) -> None:
    # "²".isdigit() is true and int("²") raises: such a segment is a missing field
    # (every branch abstains), never an internal error
    branches = {"a": {"v": [1, 2]}, "b": {"v": [1, 2]}, "c": {"v": [1, 2]}}
    err = await _agg_error(settings, policy="majority", field="v.²", branches=branches)
    assert (err.type, err.message) == (
        "validation_failed",
        "policy 'majority': no branch voted",
    )
    ok = await _agg(settings, policy="majority", field="v.1", branches=branches)
    assert ok.outputs["result"] == 2, ok

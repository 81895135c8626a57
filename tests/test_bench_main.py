"""``make bench``'s driver (bench/__main__.py): a part that raises is reported as
failed with its error, the other parts' figures are written all the same, and the
bench exits 1. The parts here are two small modules written for the test (the real
parts need minutes and a quiet machine); the driver, its file and its report are
the real ones."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

# bench/ lives at the repository root, outside the installed package; appended,
# so nothing installed is shadowed by the root's folders
sys.path.append(str(Path(__file__).resolve().parent.parent))

import bench.__main__ as driver

GOOD = """
async def run(quick):
    return {"ratio": 1.25, "quick": quick}
"""
BAD = """
def run(quick):
    raise RuntimeError("workflow update was aborted")
"""


@pytest.fixture
def parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two parts, the first failing, and the results folder in ``tmp_path``."""
    mods = tmp_path / "mods"
    mods.mkdir()
    tag = tmp_path.name.replace("-", "_")
    (mods / f"bad_{tag}.py").write_text(BAD)
    (mods / f"good_{tag}.py").write_text(GOOD)
    monkeypatch.syspath_prepend(str(mods))
    monkeypatch.setattr(driver, "PARTS", ((f"bad_{tag}", "flow"), (f"good_{tag}", "quote")))
    monkeypatch.setattr(driver, "RESULTS", tmp_path / "results")
    monkeypatch.setenv("BENCH_ONLY", "flow,quote")
    monkeypatch.setenv("BENCH_QUICK", "1")
    return tmp_path / "results" / "latest.json"


def test_a_failed_part_keeps_the_others_figures_and_fails_the_bench(
    parts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parts.parent.mkdir()
    parts.write_text(json.dumps({"flow": {"ratio": 1.1}, "measured_at": {"flow": "earlier"}}))

    assert asyncio.run(driver.main()) == 1

    out = json.loads(parts.read_text())
    assert out["quote"] == {"ratio": 1.25, "quick": True}
    assert out["flow"] == {
        "failed": "RuntimeError: workflow update was aborted",
        "previous": {"ratio": 1.1},
    }
    assert out["failed_parts"] == {"flow": "RuntimeError: workflow update was aborted"}
    assert out["measured_at"]["flow"] == "earlier" and "quote" in out["measured_at"]
    assert out["targets"]["all_met"] is False
    errs = capsys.readouterr().err
    assert "FAILED parts: flow" in errs and "workflow update was aborted" in errs


def test_a_part_measured_again_is_no_longer_listed_as_failed(
    parts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts.parent.mkdir()
    parts.write_text(
        json.dumps({"quote": {"failed": "X: y"}, "failed_parts": {"quote": "X: y", "eval": "Z"}})
    )
    monkeypatch.setenv("BENCH_ONLY", "quote")

    assert asyncio.run(driver.main()) == 0

    out = json.loads(parts.read_text())
    assert out["quote"] == {"ratio": 1.25, "quick": True}
    assert out["failed_parts"] == {"eval": "Z"}  # not measured in this run: still on record

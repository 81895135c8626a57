"""Artifact lineage with the default file store, and ``aiworker artifacts`` over it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from aiworker.activities import lineage
from aiworker.activities.artifacts import FileArtifactStore
from aiworker.activities.lineage import FileLineageIndex, RecordingArtifactStore, workflow_segment
from aiworker.workers.cli.main import main


def call(wf: str, step: str, attempt: int) -> lineage.CallLineage:
    return lineage.CallLineage(
        tenant="acme",
        worker_id="web-scrape",
        workflow_id=wf,
        step_id=lineage.step_of(f"{wf}/{step}", wf),
        attempt=attempt,
        trace_id="cd" * 16,
        idempotency_key=f"{wf}/{step}",
    )


def test_step_of_and_segments() -> None:
    assert lineage.step_of("wf-1/scrape", "wf-1") == "scrape"
    assert lineage.step_of("wf-1/fan/3", "wf-1") == "fan/3"
    assert lineage.step_of("my-key", None) == "my-key"
    assert workflow_segment("a/../b") == "a%2F..%2Fb"
    assert workflow_segment("..") == "%2E%2E"


async def test_file_lineage_and_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    index = FileLineageIndex(tmp_path)
    store = RecordingArtifactStore(FileArtifactStore(tmp_path), index)
    wf = "../escape/wf"
    with lineage.bound(call(wf, "fetch", 1)):
        a = await store.put("acme", b"<p>one</p>", "text/html")
    with lineage.bound(call(wf, "fetch", 2)):
        await store.put("acme", b"<p>one</p>", "text/html")
        b = await store.put("acme", b'{"k": 1}', "application/json")
    records = await index.records(wf)
    assert [(r.step_id, r.attempt) for r in records] == [("fetch", 1), ("fetch", 2), ("fetch", 2)]
    assert sorted((r.attempt, r.sha256) for r in records) == sorted(
        [(1, a.sha256), (2, a.sha256), (2, b.sha256)]
    )
    files = [f for f in (tmp_path / "lineage").rglob("*") if f.is_file()]
    assert [f.name for f in files] == [index.writer]  # one writer, one file of lines
    assert all(f.resolve().is_relative_to(tmp_path / "lineage") for f in files)

    monkeypatch.setenv("AIWORKER_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("AIWORKER_ARTIFACT_STORE", raising=False)
    capsys.readouterr()
    assert await run_cli("artifacts", wf, "--json") == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted(r["uri"] for r in listed) == sorted([a.uri, a.uri, b.uri])
    assert {r["trace_id"] for r in listed} == {"cd" * 16}
    assert await run_cli("artifacts", "unknown-workflow") == 3  # not found, as `items`
    assert "no artifacts recorded" in capsys.readouterr().err


async def run_cli(*args: str) -> int:
    # The CLI runs its own event loop: keep it off the test's.
    return await asyncio.to_thread(main, list(args))


async def test_file_lineage_writers_retries_torn_lines_and_older_records(tmp_path: Path) -> None:
    first, second = FileLineageIndex(tmp_path), FileLineageIndex(tmp_path)
    assert first.writer != second.writer  # two processes never append to one file
    wf = "wf-7"
    with lineage.bound(call(wf, "fetch", 1)):
        a = await RecordingArtifactStore(FileArtifactStore(tmp_path), first).put("acme", b"a")
    with lineage.bound(call(wf, "fetch", 1)):  # the same attempt again, elsewhere
        await RecordingArtifactStore(FileArtifactStore(tmp_path), second).put("acme", b"a")
    folder = tmp_path / "lineage" / wf
    assert sorted(p.name for p in folder.iterdir()) == sorted([first.writer, second.writer])
    records = await first.records(wf)
    assert [(r.sha256, r.attempt) for r in records] == [(a.sha256, 1)]  # one use, listed once

    # A writer killed in mid-line: its torn line is skipped, the next record kept.
    with (folder / first.writer).open("ab") as f:
        f.write(b'\n{"uri": "file:///x", "sha2')
    with lineage.bound(call(wf, "fetch", 2)):
        b = await RecordingArtifactStore(FileArtifactStore(tmp_path), first).put("acme", b"b")
    # A record of an earlier version, one file of its own, and a temporary file.
    older = records[0].model_copy(
        update={"attempt": 3, "created_at": "2026-01-01T00:00:00.000+00:00"}
    )
    (folder / older.record_name()).write_text(older.model_dump_json())
    (folder / ".tmp-abc").write_text("{")
    listed = await second.records(wf)
    assert sorted((r.sha256, r.attempt) for r in listed) == sorted(
        [(a.sha256, 1), (b.sha256, 2), (a.sha256, 3)]
    )

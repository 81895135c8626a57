"""The SDK finds the ``aiworker dev`` stack recorded beside it (``.aiworker/dev.json``
and its envconfig profile), unless told another server, against the session's
real Temporal server; a record nobody answers for is ignored, saying why.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import Client

from aiworker.workers.client import temporal_client
from aiworker.workers.client.client import PipelineClient
from aiworker.workers.client.temporal_client import dev_ui_url, resolve_target
from aiworker.workers.devstack import state
from aiworker.workers.devstack.devserver import free_port


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder as the working directory, with no Temporal or data-dir setting."""
    for name in ("TEMPORAL_ADDRESS", "TEMPORAL_CONFIG_FILE", "TEMPORAL_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("TEMPORAL_NAMESPACE", raising=False)
    monkeypatch.delenv("AIWORKER_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(temporal_client, "_said", set())  # each test hears its notice
    return tmp_path


async def test_the_sdk_uses_the_recorded_dev_stack_and_says_so(
    folder: Path, client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    address = client.service_client.config.target_host
    recorded = state.record(
        Path(".aiworker"),
        address=address,
        namespace=client.namespace,
        ui_url="http://127.0.0.1:18233",
        server_pid=None,
    )
    pipelines = await PipelineClient.connect()
    assert pipelines.temporal.service_client.config.target_host == address
    assert pipelines.temporal.namespace == client.namespace
    await pipelines.temporal.service_client.check_health()  # a real connection
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"aiworker: using the aiworker dev stack at {address} (from ./.aiworker/dev.json; "
        "TEMPORAL_ADDRESS or --address choose another server)\n"
    )
    assert dev_ui_url(address) == "http://127.0.0.1:18233"
    assert dev_ui_url("elsewhere:7233") is None
    # the profile file is envconfig's own: TEMPORAL_CONFIG_FILE reads it anywhere
    assert recorded.profile_path.read_text().count(f'address = "{address}"') == 1
    # another data directory (settings, or AIWORKER_DATA_DIR) records no stack
    elsewhere = resolve_target(data_dir=folder / "other")
    assert elsewhere.config["target_host"] == "localhost:7233" and elsewhere.notice is None
    state.forget(recorded)
    assert not recorded.state_path.exists()


async def test_a_server_chosen_by_the_user_wins(
    folder: Path, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    state.record(
        Path(".aiworker"),
        address=client.service_client.config.target_host,
        namespace="default",
        ui_url=None,
        server_pid=None,
    )
    assert resolve_target(target_host="mine:7233").config["target_host"] == "mine:7233"
    assert resolve_target(target_host="mine:7233").notice is None
    monkeypatch.setenv("TEMPORAL_ADDRESS", "theirs:7233")
    chosen = resolve_target()
    assert chosen.config["target_host"] == "theirs:7233"
    assert chosen.notice is None and chosen.dev_stack is None


async def test_a_record_with_nothing_listening_is_ignored(folder: Path) -> None:
    # this process is alive, but nothing listens at the recorded address
    port = free_port()
    state.record(
        Path(".aiworker"),
        address=f"127.0.0.1:{port}",
        namespace="default",
        ui_url=None,
        server_pid=None,
    )
    found = resolve_target()
    assert found.config["target_host"] == "localhost:7233"
    assert found.notice == (
        "aiworker: ignoring the dev stack recorded in ./.aiworker/dev.json: nothing accepts "
        f"connections at 127.0.0.1:{port}; connecting to localhost:7233"
    )

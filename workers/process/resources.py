"""A worker process's resources, built once per process from settings: the
activities' shared runtime (:func:`build_runtime`), the tool instances
(``activities/tools/``) the runtime hands to workers through their toolbox
(``activities/toolbox.py``), the language model, stores and S3 clients.

The ``artifact_store`` tool is the store ``AIWORKER_ARTIFACT_STORE`` names
(``file``: under the data directory; ``s3://bucket/prefix``: S3-compatible),
wrapped to record lineage. S3 clients are per process and shared by the
artifact store, the lineage index and the external payload driver.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aiworker.activities.artifacts import FileArtifactStore
from aiworker.activities.breakers import BreakerRegistry, SharedBreakers
from aiworker.activities.lineage import FileLineageIndex, LineageIndex, RecordingArtifactStore
from aiworker.activities.llm import LanguageModel, LlmMetrics, ModelsFileError, load_registry
from aiworker.activities.metrics import WorkerMetrics
from aiworker.activities.publish import WebhookPoster
from aiworker.activities.runtime import WorkerRuntime
from aiworker.activities.tools import scrape_tools
from aiworker.config import catalog
from aiworker.config.extras import installed, require
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.spec import PromptImplementation
from aiworker.workers.errors import StartupError
from aiworker.workers.process.worker_set import WorkerSet

if TYPE_CHECKING:
    # The AWS SDK loads only in processes configured for S3.
    from aiworker.activities.artifacts_s3 import S3Connection

log = logging.getLogger("aiworker.process")

_S3: dict[tuple[str | None, ...], S3Connection] = {}


# what a missing 's3' extra is reported for
S3_FEATURE = "the S3 artifact store (AIWORKER_ARTIFACT_STORE=s3://...)"


def s3_connection() -> S3Connection:
    """This process's S3 client, configured by the AWS SDK's own variables.

    ``AWS_ENDPOINT_URL``, credentials and ``AWS_DEFAULT_REGION`` are read by
    botocore itself; ``AWS_REGION``, which botocore ignores, is passed in.
    """
    key = tuple(
        os.environ.get(k)
        for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_ACCESS_KEY_ID")
    )
    conn = _S3.get(key)
    if conn is None:
        require("s3", S3_FEATURE)
        from aiworker.activities.artifacts_s3 import S3Connection

        conn = _S3[key] = S3Connection(region_name=os.environ.get("AWS_REGION"))
    return conn


async def close_connections() -> None:
    """Close every S3 client this process opened (at shutdown)."""
    conns = list(_S3.values())
    _S3.clear()
    for c in conns:
        await c.aclose()


def artifact_store(settings: Settings, *, elsewhere: bool = False) -> RecordingArtifactStore:
    """The configured artifact store, recording lineage; ``elsewhere``: a file store
    also reads a run's artifacts from another data directory on this machine
    (:class:`~aiworker.activities.artifacts.FileArtifactStore`; for clients that
    read results, never for workers)."""
    if settings.artifact_store.startswith("s3://"):
        require("s3", S3_FEATURE)
        from aiworker.activities.artifacts_s3 import S3ArtifactStore, S3LineageIndex, parse_s3_url

        bucket, prefix = parse_s3_url(settings.artifact_store)
        conn = s3_connection()
        return RecordingArtifactStore(
            S3ArtifactStore(conn, bucket, prefix), S3LineageIndex(conn, bucket, prefix)
        )
    return RecordingArtifactStore(
        FileArtifactStore(settings.data_dir, elsewhere=elsewhere),
        FileLineageIndex(settings.data_dir),
    )


def lineage_index(settings: Settings) -> LineageIndex:
    """Where the configured store keeps lineage (for ``aiworker artifacts``)."""
    return artifact_store(settings).index


@functools.cache
def _llm_metrics() -> LlmMetrics:
    # The default registry takes each metric name once per process.
    return LlmMetrics()


def build_language_model(
    settings: Settings,
    env: Mapping[str, str] | None = None,
    *,
    metrics: WorkerMetrics | None = None,
    llm_metrics: LlmMetrics | None = None,
    shared: SharedBreakers | None = None,
) -> LanguageModel:
    """The ``language_model`` tool: the model registry checked now, so a bad
    ``AIWORKER_MODELS_FILE`` or a missing key stops the process at start."""
    try:
        registry = load_registry(settings, os.environ if env is None else env)
    except ModelsFileError as e:
        raise StartupError(f"model registry: {e}") from None
    return LanguageModel(
        registry,
        breakers=BreakerRegistry.from_settings(
            "provider", settings, metrics=metrics, shared=shared
        ),
        metrics=llm_metrics if llm_metrics is not None else _llm_metrics(),
    )


def build_tools(settings: Settings, metrics: WorkerMetrics | None = None) -> dict[str, Any]:
    """Every tool this process can hand to workers, by tool name."""
    tools: dict[str, Any] = {}
    # breaker openings are shared with every worker process through Temporal
    shared = SharedBreakers(settings.queue(names.PIPELINES_QUEUE))
    tools["language_model"] = build_language_model(settings, metrics=metrics, shared=shared)
    # fetch_url, parse_html, render: only where the 'scrape' extra is installed (a core
    # install serves no worker that uses them; web-scrape there fails to start, naming it)
    if installed("scrape"):
        tools.update(
            scrape_tools(
                settings,
                metrics=metrics,
                breakers=BreakerRegistry.from_settings(
                    "host", settings, metrics=metrics, shared=shared
                ),
            )
        )
    tools["artifact_store"] = artifact_store(settings)
    # POSTs for the publish worker, under the same egress policy as fetches.
    tools["http_post"] = WebhookPoster(settings)
    # MCP servers for the mcp-call worker (llm-agent's mcp:<server>/<tool>), under the
    # same egress policy; only where the 'llm' extra (the mcp package) is installed
    if installed("llm"):
        from aiworker.activities.tools.mcp import McpClient

        tools["mcp"] = McpClient.from_settings(settings)
    return tools


def build_runtime(
    settings: Settings,
    metrics: WorkerMetrics | None = None,
    tools: dict[str, Any] | None = None,
    workers: WorkerSet | None = None,
) -> WorkerRuntime:
    """The runtime shared by every activity of this process (under ``workers``' specs,
    else the installed catalog's)."""
    from aiworker.workers.process.logs import redact_also
    from aiworker.workers.process.resources import build_tools

    runtime = WorkerRuntime(
        settings,
        workers.specs if workers is not None else catalog.current_specs(),
        tools=build_tools(settings, metrics) if tools is None else tools,
        metrics=metrics,
    )
    # keys from the models file are known only now: logs must hide them too
    redact_also(runtime.redactor.secrets)
    if workers is not None:
        warn_unknown_aliases(workers, runtime.tools.get("language_model"))
    return runtime


def warn_unknown_aliases(workers: WorkerSet, language_model: Any) -> None:
    """Say at start which prompt workers name a model alias this process lacks.

    Not fatal: a process may serve other workers while the model is configured
    elsewhere; each call of such a worker fails ``invalid_input`` naming the alias.
    """
    aliases = set(getattr(getattr(language_model, "registry", None), "aliases", None) or ())
    for worker_id in workers.served:  # specs only: nothing is imported to warn
        impl = workers.specs[worker_id].implementation
        if isinstance(impl, PromptImplementation) and impl.model not in aliases:
            log.warning(
                "worker.model_alias_unknown",
                extra={
                    "aiworker": {
                        "event": "model_alias_unknown",
                        "worker_id": worker_id,
                        "alias": impl.model,
                        "known_aliases": sorted(aliases),
                        "origin": workers.origin(worker_id),
                    }
                },
            )

"""Tool instances for the worker runtime, built once per process from settings."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

from activities.breaker import BreakerRegistry
from activities.llm import LanguageModel, LlmMetrics, ModelsFileError, load_registry
from activities.metrics import WorkerMetrics
from activities.publish import WebhookPoster
from activities.tools import scrape_tools
from schemas.settings import Settings
from workers.worker import StartupError


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
) -> LanguageModel:
    """The ``language_model`` tool: the model registry checked now, so a bad
    ``AIWORKER_MODELS_FILE`` or a missing key stops the process at start."""
    try:
        registry = load_registry(settings, os.environ if env is None else env)
    except ModelsFileError as e:
        raise StartupError(f"model registry: {e}") from None
    return LanguageModel(
        registry,
        breakers=BreakerRegistry("provider", metrics=metrics),
        metrics=llm_metrics if llm_metrics is not None else _llm_metrics(),
    )


def build_tools(settings: Settings, metrics: WorkerMetrics | None = None) -> dict[str, Any]:
    """Every tool this process can hand to workers, by tool name."""
    tools: dict[str, Any] = {}
    tools["language_model"] = build_language_model(settings, metrics=metrics)
    # fetch_url, parse_html, artifact_store
    tools.update(scrape_tools(settings, metrics=metrics))
    # POSTs for the publish worker, under the same egress policy as fetches.
    tools["http_post"] = WebhookPoster(settings)
    return tools

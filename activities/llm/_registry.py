"""The model registry: aliases -> provider, endpoint, model, key, limits.

Pipelines name aliases (``default``, ``small``, ...), never providers or keys,
so a fallback step can name a cheaper model and an operator can move an alias
to another provider without touching pipelines. The ``default`` alias comes
from ``AIWORKER_LLM_BASE_URL`` / ``_MODEL`` / ``_API_KEY`` / ``_PROVIDER``;
more aliases from the JSON file ``AIWORKER_MODELS_FILE``::

    {"models": {
      "small": {"provider": "openai", "base_url": "https://api.openai.com/v1",
                "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY",
                "context_window": 128000, "max_output_tokens": 16384,
                "rpm": 500, "tpm": 200000,
                "usd_per_million_tokens": {"input": 0.15, "cached_input": 0.075, "output": 0.6}},
      "claude": {"provider": "anthropic", "model": "claude-3-5-haiku-latest",
                 "api_key_file": "/run/secrets/anthropic", "context_window": 200000}
    }}

The file is read and checked once at process start (:func:`load_registry`):
a bad file, an unset key variable or an unreadable key file stops the process
with a message naming the alias and field. Keys are held as ``SecretStr``
and never appear in a ``repr``, a log line or an error message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from aiworker.activities.constraints import min_optional
from aiworker.activities.llm._pricing import Prices
from aiworker.config.settings import Settings

DEFAULT_BASE_URLS = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
}
_ALIAS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_HEADER = re.compile(r"^[A-Za-z0-9-]+$")


class ModelsFileError(ValueError):
    """The model registry cannot be built; the message names the alias and field."""


class ModelEntry(BaseModel):
    """One alias as written in the models file (the user-facing format)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: Literal["openai", "anthropic"] = "openai"
    base_url: str | None = Field(
        default=None,
        description="defaults to the provider's public API; OpenAI-style URLs end in /v1",
    )
    model: str = Field(min_length=1)
    api_key_env: str | None = Field(default=None, description="environment variable with the key")
    api_key_file: Path | None = Field(default=None, description="file whose content is the key")
    api_key_header: str | None = Field(
        default=None,
        description="header carrying the key; default Authorization: Bearer (openai) or "
        "x-api-key (anthropic); e.g. api-key for Azure OpenAI",
    )
    headers: dict[str, str] = Field(default_factory=dict, description="extra non-secret headers")
    query: dict[str, str] = Field(
        default_factory=dict, description="extra query parameters, e.g. api-version for Azure"
    )
    context_window: int | None = Field(default=None, ge=1, description="tokens; None: unknown")
    max_output_tokens: int | None = Field(default=None, ge=1)
    rpm: int | None = Field(default=None, ge=1, description="requests per minute, client side")
    tpm: int | None = Field(default=None, ge=1, description="tokens per minute, client side")
    structured_output: Literal["json_schema", "json_object", "tool", "prompt"] | None = Field(
        default=None,
        description="how response_schema reaches the model; default json_schema (openai) "
        "or tool (anthropic); prompt for servers without structured output",
    )
    anthropic_version: str = "2023-06-01"
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = Field(
        default="max_tokens",
        description="OpenAI's newer models take max_completion_tokens instead of max_tokens",
    )
    usd_per_million_tokens: Prices | None = Field(
        default=None,
        description="prices in US dollars per million tokens (input, output, cached_input, "
        "cache_write); absent: calls cost 0",
    )

    @model_validator(mode="after")
    def _check(self) -> ModelEntry:
        if self.api_key_env and self.api_key_file:
            raise ValueError("give api_key_env or api_key_file, not both")
        if self.base_url is not None:
            parts = urlsplit(self.base_url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(f"base_url {self.base_url!r} is not an http(s) URL")
        if self.api_key_header is not None and not _HEADER.match(self.api_key_header):
            raise ValueError(f"api_key_header {self.api_key_header!r} is not a header name")
        for name in self.headers:
            if not _HEADER.match(name):
                raise ValueError(f"headers: {name!r} is not a header name")
            if name.lower() in ("authorization", "x-api-key", "api-key"):
                raise ValueError(
                    f"headers: {name!r} would put a secret in the models file; "
                    "use api_key_env or api_key_file"
                )
        allowed = {
            "openai": ("json_schema", "json_object", "prompt"),
            "anthropic": ("tool", "prompt"),
        }[self.provider]
        if self.structured_output is not None and self.structured_output not in allowed:
            raise ValueError(
                f"structured_output {self.structured_output!r} is not available for "
                f"provider {self.provider!r} (one of {', '.join(allowed)})"
            )
        return self


class ModelsFile(BaseModel):
    """The models file: ``{"models": {alias: ModelEntry}}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    models: dict[str, ModelEntry]


@dataclass(frozen=True)
class ModelConfig:
    """A resolved alias: everything a call needs, the key as a secret."""

    alias: str
    provider: Literal["openai", "anthropic"]
    base_url: str
    model: str
    api_key: SecretStr | None = None
    api_key_header: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    query: tuple[tuple[str, str], ...] = ()
    context_window: int | None = None
    max_output_tokens: int | None = None
    rpm: int | None = None
    tpm: int | None = None
    structured_output: str = "json_schema"
    anthropic_version: str = "2023-06-01"
    max_tokens_field: str = "max_tokens"
    prices: Prices | None = None

    @property
    def target(self) -> str:
        """The provider endpoint (``host[:port]``): the breaker and limiter key."""
        return f"{self.provider}:{urlsplit(self.base_url).netloc}"


class ModelRegistry:
    """Aliases of one process; built once at start and shared by every call."""

    def __init__(self, models: Mapping[str, ModelConfig]) -> None:
        self._models = dict(models)
        # Aliases on one endpoint share one client-side limit: the tightest configured.
        self.limits: dict[str, tuple[int | None, int | None]] = {}
        for m in self._models.values():
            rpm, tpm = self.limits.get(m.target, (None, None))
            self.limits[m.target] = (min_optional(rpm, m.rpm), min_optional(tpm, m.tpm))

    def __contains__(self, alias: object) -> bool:
        return alias in self._models

    def get(self, alias: str) -> ModelConfig | None:
        return self._models.get(alias)

    @property
    def aliases(self) -> list[str]:
        return sorted(self._models)

    def secret_values(self) -> list[str]:
        """Every key this registry holds, for redaction."""
        return [
            m.api_key.get_secret_value()
            for m in self._models.values()
            if m.api_key is not None and m.api_key.get_secret_value()
        ]


def _resolve(alias: str, e: ModelEntry, env: Mapping[str, str]) -> ModelConfig:
    key: SecretStr | None = None
    if e.api_key_env:
        value = env.get(e.api_key_env, "")
        if not value:
            raise ModelsFileError(
                f"model alias {alias!r}: api_key_env {e.api_key_env} is not set in the environment"
            )
        key = SecretStr(value)
    elif e.api_key_file:
        try:
            value = e.api_key_file.read_text("utf-8").strip()
        except OSError as err:
            raise ModelsFileError(
                f"model alias {alias!r}: api_key_file {str(e.api_key_file)!r} cannot be read "
                f"({err.strerror or type(err).__name__})"
            ) from None
        if not value:
            raise ModelsFileError(
                f"model alias {alias!r}: api_key_file {str(e.api_key_file)!r} is empty"
            )
        key = SecretStr(value)
    return ModelConfig(
        alias=alias,
        provider=e.provider,
        base_url=(e.base_url or DEFAULT_BASE_URLS[e.provider]).rstrip("/"),
        model=e.model,
        api_key=key,
        api_key_header=e.api_key_header,
        headers=tuple(sorted(e.headers.items())),
        query=tuple(sorted(e.query.items())),
        context_window=e.context_window,
        max_output_tokens=e.max_output_tokens,
        rpm=e.rpm,
        tpm=e.tpm,
        structured_output=e.structured_output
        or ("json_schema" if e.provider == "openai" else "tool"),
        anthropic_version=e.anthropic_version,
        max_tokens_field=e.max_tokens_field,
        prices=e.usd_per_million_tokens,
    )


def parse_models_file(text: str, source: str = "models file") -> ModelsFile:
    """Parse and check the models file; ``ModelsFileError`` names alias and field."""
    try:
        doc: Any = json.loads(text)
    except json.JSONDecodeError as e:
        raise ModelsFileError(f"{source}: not JSON ({e})") from None
    try:
        parsed = ModelsFile.model_validate(doc)
    except ValidationError as e:
        problems = []
        for err in e.errors()[:5]:
            loc = ".".join(str(p) for p in err["loc"]) or "(root)"
            problems.append(f"{loc}: {err['msg'].removeprefix('Value error, ')}")
        raise ModelsFileError(f"{source}: " + "; ".join(problems)) from None
    for alias in parsed.models:
        if not _ALIAS.match(alias):
            raise ModelsFileError(
                f"{source}: alias {alias!r} must be 1-64 letters, digits, '.', '_' or '-'"
            )
    return parsed


def load_registry(settings: Settings, env: Mapping[str, str]) -> ModelRegistry:
    """Build the registry from settings, the models file and ``env`` (for key variables).

    Raises ``ModelsFileError`` with a message fit for an operator.
    """
    models: dict[str, ModelConfig] = {}
    if settings.llm_base_url or settings.llm_model or settings.llm_api_key:
        if not settings.llm_model:
            raise ModelsFileError(
                "AIWORKER_LLM_MODEL is required when AIWORKER_LLM_BASE_URL or "
                "AIWORKER_LLM_API_KEY is set (the model name of the `default` alias)"
            )
        try:
            entry = ModelEntry(
                provider=settings.llm_provider,
                base_url=settings.llm_base_url,
                model=settings.llm_model,
            )
        except ValidationError as e:
            raise ModelsFileError(
                f"AIWORKER_LLM_BASE_URL: {e.errors()[0]['msg'].removeprefix('Value error, ')}"
            ) from None
        default = _resolve("default", entry, env)
        if settings.llm_api_key is not None:
            default = replace(default, api_key=settings.llm_api_key)
        models["default"] = default
    if settings.models_file is not None:
        path = settings.models_file
        source = f"AIWORKER_MODELS_FILE {str(path)!r}"
        try:
            text = path.read_text("utf-8")
        except OSError as e:
            raise ModelsFileError(
                f"{source} cannot be read ({e.strerror or type(e).__name__})"
            ) from None
        for alias, entry in parse_models_file(text, source).models.items():
            if alias in models:
                raise ModelsFileError(
                    f"{source}: alias {alias!r} is already defined by AIWORKER_LLM_* variables"
                )
            models[alias] = _resolve(alias, entry, env)
    return ModelRegistry(models)

"""Operator settings: every ``AIWORKER_*`` variable in one frozen model.

Built once at process start from an explicit environment mapping
(:meth:`Settings.from_env`) and validated there, so a typo stops the process
with a clear message instead of failing a workflow task later. Activities get
the object through their constructors; they never read the environment.
The Temporal connection itself comes from ``temporalio.envconfig``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from aiworker.schemas.caps import DEFAULT_FOREACH_INLINE_ITEMS, SETTING_OF, Caps
from aiworker.schemas.mcp import McpServersFile, McpServersFileError, load_mcp_servers
from aiworker.schemas.messages import with_suggestion
from aiworker.schemas.spec import parse_rate
from aiworker.schemas.tenants import TenantRegistry, TenantsFileError, domain_list, load_tenants

ENV_PREFIX = "AIWORKER_"


# Where `aiworker dev` keeps the registry secret it generates (in its data dir), and
# the shortest secret accepted.
REGISTRY_SECRET_FILE = "registry.secret"
MIN_REGISTRY_SECRET_CHARS = 16


class SettingsError(ValueError):
    """Settings that cannot start a process; the message names the variable."""


def _csv(value: str | None) -> list[str]:
    if not value:
        return []
    return [p.strip() for p in value.split(",") if p.strip()]


def _bool(name: str, value: str | None, default: bool) -> bool:
    if value is None or value == "":
        return default
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name}={value!r}: expected true or false")


class RateLimitRule(BaseModel):
    """``worker:tenant=N/period``; ``*`` matches any tenant."""

    model_config = ConfigDict(frozen=True)
    worker_id: str
    tenant: str
    limit: int
    period_seconds: float


class Settings(BaseModel):
    """Process-wide settings; every variable is in docs/reference/settings.md (generated)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    data_dir: Path = Path(".aiworker")
    task_queues: tuple[str, ...] = ()
    task_queue_suffix: str = ""
    metrics_port: int = Field(default=9464, ge=0, le=65535)
    metrics_host: str = "0.0.0.0"
    allow_private_networks: bool = False
    egress_allow: tuple[str, ...] = ()
    llm_base_url: str | None = None
    ui_url: str | None = None
    llm_model: str | None = None
    llm_api_key: SecretStr | None = None
    llm_provider: Literal["openai", "anthropic"] = "openai"
    models_file: Path | None = None
    # `aiworker dev` / `demo` start a local model as `default` when none is configured.
    local_model: bool = True
    # ...and with this GGUF file on disk instead of the bundled SmolLM2-135M.
    local_model_file: Path | None = None
    rate_limits: tuple[RateLimitRule, ...] = ()
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    max_concurrent_activities: int = Field(default=100, ge=1)
    max_concurrent_workflow_tasks: int = Field(default=100, ge=1)
    pollers: int = Field(default=10, ge=1, le=100)
    shutdown_grace_seconds: float = Field(default=60.0, ge=0)
    # glibc malloc arenas of a worker process (workers/devstack/arenas.py); 0: glibc's default.
    malloc_arenas: int = Field(default=2, ge=0, le=1024)
    # Workers whose spec says `"execution": "local"` run as local activities in the
    # process that runs the pipeline (schemas/execution.py); false: every call an activity.
    local_activities: bool = True
    # aiworker's own workflows in the SDK's workflow sandbox too (workers/process/plugin.py
    # OwnWorkflowsRunner); false: they run unsandboxed, every other workflow sandboxed.
    workflow_sandbox: bool = False
    # A for_each over more items than this keeps its items' outputs in the artifact
    # store and its `outputs.items` as a reference (schemas.pipeline.ItemsRef).
    foreach_inline_items: int = Field(default=DEFAULT_FOREACH_INLINE_ITEMS, ge=0)
    # Worker Deployment Versioning (workers/process/deployments.py; the Lambda worker always uses
    # it). None (AIWORKER_VERSIONING unset): on in `aiworker worker` and `dev` processes
    # (workers/devstack/supervisor.py), off where workers are built in code (embedded, tests).
    versioning: bool | None = None
    # The deployment is `deployment_name` + `task_queue_suffix` (an isolated stack is an
    # isolated deployment); the build id defaults to the package version plus a hash of
    # the workflow code (workers/process/deployments.py `build_id`).
    deployment_name: str = Field(
        default="aiworker", min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_-]+$"
    )
    build_id: str | None = Field(
        default=None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._-]+$"
    )
    # Who makes a new version current: `auto` this process when the deployment has no
    # current version (a first deploy, compose, one process), `always` this process
    # (`aiworker dev`), `never` the operator (`aiworker deployment set-current`).
    deployment_current: Literal["auto", "always", "never"] = "auto"
    # The live worker registry (workers/process/live_registry.py): how long a worker process's
    # entry lives unless refreshed (every third of it); 0: the process does not publish.
    registry_ttl_seconds: float = Field(default=30.0, ge=0, le=86_400, allow_inf_nan=False)
    # The deployment's registry secret: every aiworker process of a deployment has the
    # same one; entries are signed with it (HMAC-SHA256) and readers use only entries
    # it verifies. None: entries go out unsigned and readers use local specs only.
    # Unset in the environment, `<data dir>/registry.secret` (written by `aiworker dev`).
    registry_secret: SecretStr | None = None
    artifact_store: str = "file"
    payload_threshold_bytes: int = Field(default=256 * 1024, ge=0)
    # Circuit breakers per host and per model provider (activities/breaker.py).
    breaker_failure_threshold: int = Field(default=5, ge=1)
    breaker_window_seconds: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    breaker_open_seconds: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    # Politeness per host (activities/tools/autothrottle.py): the delay between request
    # starts to one host follows its latency and 429/503 replies between a floor and a
    # ceiling, as Scrapy's AutoThrottle does; robots.txt Crawl-delay is a floor too.
    scrape_min_delay_seconds: float = Field(default=0.0, ge=0, le=3600, allow_inf_nan=False)
    scrape_max_delay_seconds: float = Field(default=30.0, ge=0, le=3600, allow_inf_nan=False)
    autothrottle: bool = True
    autothrottle_target_concurrency: float = Field(default=4.0, gt=0, le=1000, allow_inf_nan=False)
    # Workers beyond the built-ins (besides the `aiworker.plugins` entry points):
    # importable modules with a WORKERS iterable, and directories of spec files
    # (prompt and external workers).
    worker_modules: tuple[str, ...] = ()
    worker_specs: tuple[Path, ...] = ()
    # The tenant registry (schemas/tenants.py): None, any tenant name is taken as given.
    tenants_file: Path | None = None
    tenants: TenantRegistry | None = None
    # MCP servers an llm-agent may name as tools (schemas/mcp.py): None, no server.
    mcp_servers_file: Path | None = None
    mcp_servers: McpServersFile | None = None
    # Caps on fan-out, nesting and references (schemas/caps.py), AIWORKER_MAX_*.
    caps: Caps = Caps()
    # The HTTP front door (`aiworker serve`, workers/frontdoor/serve.py): its address, the
    # hashed API keys and the webhooks it accepts, a rate per key and a body cap.
    serve_host: str = "0.0.0.0"
    serve_port: int = Field(default=8000, ge=0, le=65535)
    api_keys_file: Path | None = None
    hooks_file: Path | None = None
    serve_rate_limit: str = "120/min"
    serve_max_body_bytes: int = Field(default=1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    # Slow clients (workers/frontdoor/conn.py): a request's headers must arrive within the
    # header timeout, its body within the body timeout after them; at most
    # serve_max_connections connections at once (one more is answered 503 and closed).
    serve_header_timeout_seconds: float = Field(default=10.0, gt=0, le=3600, allow_inf_nan=False)
    serve_body_timeout_seconds: float = Field(default=30.0, gt=0, le=3600, allow_inf_nan=False)
    serve_max_connections: int = Field(default=512, ge=1, le=100_000)
    # Event streams (workers/frontdoor/events.py) a key and a tenant hold open at once (one
    # more is 429 with Retry-After), and how long one lives before the door ends it and
    # the client resumes with Last-Event-ID: a run (a wait step) may last a year.
    serve_max_streams_per_key: int = Field(default=16, ge=1, le=100_000)
    serve_max_streams_per_tenant: int = Field(default=64, ge=1, le=100_000)
    serve_stream_max_seconds: float = Field(default=600.0, gt=0, le=86_400, allow_inf_nan=False)
    # Where callers reach `aiworker serve` (https://api.example.com): a wait step's
    # `callback_url` is built on it by the worker process that runs the pipeline; unset,
    # the callback_url is the path alone (/v1/callbacks/<token>).
    serve_public_url: str | None = None
    # The headless Chromium that web-scrape's `render: "browser"` drives (Debian's
    # `chromium` package); launched only when a step asks for it.
    browser_executable: Path = Path("/usr/bin/chromium")
    # Requests one rendered page has out at once (activities/tools/browser_gate.py).
    browser_max_in_flight: int = Field(default=6, ge=1, le=1000)
    # The fetch tool's connection pool (one per process, every tenant's fetches) and
    # the part of it one tenant holds at once (activities/tools/shares.py).
    fetch_max_connections: int = Field(default=100, ge=1, le=100_000)
    fetch_tenant_share: float = Field(default=0.5, gt=0, le=1, allow_inf_nan=False)

    @field_validator("task_queue_suffix")
    @classmethod
    def _suffix(cls, v: str) -> str:
        if v and not all(c.isalnum() or c in "-_." for c in v):
            raise ValueError("may only hold letters, digits, '-', '_' and '.'")
        return v

    @field_validator("registry_secret")
    @classmethod
    def _registry_secret(cls, v: SecretStr | None) -> SecretStr | None:
        # a short secret is guessable offline from any signed entry in a history
        if v is not None and len(v.get_secret_value().strip()) < MIN_REGISTRY_SECRET_CHARS:
            raise ValueError(f"must be at least {MIN_REGISTRY_SECRET_CHARS} characters")
        return v

    @field_validator("artifact_store")
    @classmethod
    def _store(cls, v: str) -> str:
        v = v.strip()
        if v in ("file", "file://"):
            return "file"
        if v.startswith("s3://") and v[len("s3://") :].split("/", 1)[0]:
            return v.rstrip("/")
        raise ValueError("expected 'file' or 's3://bucket[/prefix]'")

    @field_validator("serve_public_url")
    @classmethod
    def _public_url(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        v = v.strip().rstrip("/")
        scheme, _, rest = v.partition("://")
        if scheme not in ("http", "https") or not rest or any(c in rest for c in "?# "):
            raise ValueError("expected an http(s) URL without query or fragment")
        return v

    @field_validator("serve_rate_limit")
    @classmethod
    def _serve_rate(cls, v: str) -> str:
        parse_rate(v)
        return v

    @field_validator("egress_allow")
    @classmethod
    def _domains(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return domain_list(v)

    def secret_values(self) -> list[str]:
        """Configured secrets, for redaction in logs."""
        return [
            s.get_secret_value()
            for s in (self.llm_api_key, self.registry_secret)
            if s and s.get_secret_value()
        ]

    def queue(self, base: str) -> str:
        """A task queue name with this deployment's suffix."""
        return base + self.task_queue_suffix

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Build settings from an environment mapping; ``SettingsError`` names the variable."""
        known = {
            "DATA_DIR",
            "TASK_QUEUES",
            "TASK_QUEUE_SUFFIX",
            "METRICS_PORT",
            "METRICS_HOST",
            "ALLOW_PRIVATE_NETWORKS",
            "EGRESS_ALLOW",
            "LLM_BASE_URL",
            "UI_URL",
            "SERVE_PUBLIC_URL",
            "LLM_MODEL",
            "LLM_API_KEY",
            "LLM_PROVIDER",
            "MODELS_FILE",
            "LOCAL_MODEL",
            "LOCAL_MODEL_FILE",
            "LOCAL_ACTIVITIES",
            "WORKFLOW_SANDBOX",
            "RATE_LIMITS",
            "LOG_LEVEL",
            "MAX_CONCURRENT_ACTIVITIES",
            "MAX_CONCURRENT_WORKFLOW_TASKS",
            "POLLERS",
            "SHUTDOWN_GRACE_SECONDS",
            "MALLOC_ARENAS",
            "VERSIONING",
            "DEPLOYMENT_NAME",
            "BUILD_ID",
            "REGISTRY_TTL_SECONDS",
            "REGISTRY_SECRET",
            "DEPLOYMENT_CURRENT",
            "ARTIFACT_STORE",
            "PAYLOAD_THRESHOLD_BYTES",
            "BREAKER_FAILURE_THRESHOLD",
            "BREAKER_WINDOW_SECONDS",
            "BREAKER_OPEN_SECONDS",
            "WORKER_MODULES",
            "WORKER_SPECS",
            "TENANTS_FILE",
            "MCP_SERVERS_FILE",
            "SERVE_HOST",
            "SERVE_PORT",
            "API_KEYS_FILE",
            "HOOKS_FILE",
            "SERVE_RATE_LIMIT",
            "SERVE_MAX_BODY_BYTES",
            "SERVE_HEADER_TIMEOUT_SECONDS",
            "SERVE_BODY_TIMEOUT_SECONDS",
            "SERVE_MAX_CONNECTIONS",
            "SERVE_MAX_STREAMS_PER_KEY",
            "SERVE_MAX_STREAMS_PER_TENANT",
            "SERVE_STREAM_MAX_SECONDS",
            "SCRAPE_MIN_DELAY_SECONDS",
            "SCRAPE_MAX_DELAY_SECONDS",
            "AUTOTHROTTLE",
            "AUTOTHROTTLE_TARGET_CONCURRENCY",
            "BROWSER_EXECUTABLE",
            "BROWSER_MAX_IN_FLIGHT",
            "FETCH_MAX_CONNECTIONS",
            "FETCH_TENANT_SHARE",
            "FOREACH_INLINE_ITEMS",
            *(name.removeprefix(ENV_PREFIX) for name in SETTING_OF.values()),
        }
        # Variables consumed by other parts (tests, dev server) are not settings.
        ignored_prefixes = ("TEST_", "DEV_")
        for key in env:
            if key.startswith(ENV_PREFIX):
                name = key[len(ENV_PREFIX) :]
                if name not in known and not name.startswith(ignored_prefixes):
                    raise SettingsError(_unknown_setting(key, known))

        def get(name: str) -> str | None:
            v = env.get(ENV_PREFIX + name)
            return v if v not in (None, "") else None

        raw: dict[str, Any] = {}
        if (v := get("DATA_DIR")) is not None:
            raw["data_dir"] = Path(v)
        raw["task_queues"] = tuple(_csv(get("TASK_QUEUES")))
        if (v := get("TASK_QUEUE_SUFFIX")) is not None:
            raw["task_queue_suffix"] = v
        for name, key in (
            ("METRICS_PORT", "metrics_port"),
            ("MAX_CONCURRENT_ACTIVITIES", "max_concurrent_activities"),
            ("MAX_CONCURRENT_WORKFLOW_TASKS", "max_concurrent_workflow_tasks"),
            ("POLLERS", "pollers"),
            ("MALLOC_ARENAS", "malloc_arenas"),
            ("FOREACH_INLINE_ITEMS", "foreach_inline_items"),
            ("PAYLOAD_THRESHOLD_BYTES", "payload_threshold_bytes"),
            ("BREAKER_FAILURE_THRESHOLD", "breaker_failure_threshold"),
            ("BREAKER_WINDOW_SECONDS", "breaker_window_seconds"),
            ("BREAKER_OPEN_SECONDS", "breaker_open_seconds"),
            ("SERVE_PORT", "serve_port"),
            ("SERVE_MAX_BODY_BYTES", "serve_max_body_bytes"),
            ("SERVE_HEADER_TIMEOUT_SECONDS", "serve_header_timeout_seconds"),
            ("SERVE_BODY_TIMEOUT_SECONDS", "serve_body_timeout_seconds"),
            ("SERVE_MAX_CONNECTIONS", "serve_max_connections"),
            ("SERVE_MAX_STREAMS_PER_KEY", "serve_max_streams_per_key"),
            ("SERVE_MAX_STREAMS_PER_TENANT", "serve_max_streams_per_tenant"),
            ("SERVE_STREAM_MAX_SECONDS", "serve_stream_max_seconds"),
            ("SCRAPE_MIN_DELAY_SECONDS", "scrape_min_delay_seconds"),
            ("SCRAPE_MAX_DELAY_SECONDS", "scrape_max_delay_seconds"),
            ("AUTOTHROTTLE_TARGET_CONCURRENCY", "autothrottle_target_concurrency"),
            ("BROWSER_MAX_IN_FLIGHT", "browser_max_in_flight"),
            ("FETCH_MAX_CONNECTIONS", "fetch_max_connections"),
            ("FETCH_TENANT_SHARE", "fetch_tenant_share"),
        ):
            if (v := get(name)) is not None:
                raw[key] = v
        for name, key in (
            ("METRICS_HOST", "metrics_host"),
            ("LLM_BASE_URL", "llm_base_url"),
            ("UI_URL", "ui_url"),
            ("LLM_MODEL", "llm_model"),
            ("LLM_API_KEY", "llm_api_key"),
            ("LLM_PROVIDER", "llm_provider"),
            ("MODELS_FILE", "models_file"),
            ("LOCAL_MODEL_FILE", "local_model_file"),
            ("SHUTDOWN_GRACE_SECONDS", "shutdown_grace_seconds"),
            ("REGISTRY_TTL_SECONDS", "registry_ttl_seconds"),
            ("REGISTRY_SECRET", "registry_secret"),
            ("DEPLOYMENT_NAME", "deployment_name"),
            ("BUILD_ID", "build_id"),
            ("DEPLOYMENT_CURRENT", "deployment_current"),
            ("ARTIFACT_STORE", "artifact_store"),
            ("SERVE_HOST", "serve_host"),
            ("API_KEYS_FILE", "api_keys_file"),
            ("HOOKS_FILE", "hooks_file"),
            ("SERVE_RATE_LIMIT", "serve_rate_limit"),
            ("SERVE_PUBLIC_URL", "serve_public_url"),
            ("BROWSER_EXECUTABLE", "browser_executable"),
        ):
            if (v := get(name)) is not None:
                raw[key] = v
        if (v := get("LOG_LEVEL")) is not None:
            raw["log_level"] = v.upper()
        raw["allow_private_networks"] = _bool(
            ENV_PREFIX + "ALLOW_PRIVATE_NETWORKS", get("ALLOW_PRIVATE_NETWORKS"), False
        )
        raw["autothrottle"] = _bool(ENV_PREFIX + "AUTOTHROTTLE", get("AUTOTHROTTLE"), True)
        raw["local_model"] = _bool(ENV_PREFIX + "LOCAL_MODEL", get("LOCAL_MODEL"), True)
        raw["local_activities"] = _bool(
            ENV_PREFIX + "LOCAL_ACTIVITIES", get("LOCAL_ACTIVITIES"), True
        )
        raw["workflow_sandbox"] = _bool(
            ENV_PREFIX + "WORKFLOW_SANDBOX", get("WORKFLOW_SANDBOX"), False
        )
        if (v := get("VERSIONING")) is not None:
            raw["versioning"] = _bool(ENV_PREFIX + "VERSIONING", v, True)
        raw["egress_allow"] = tuple(_csv(get("EGRESS_ALLOW")))
        raw["worker_modules"] = tuple(_csv(get("WORKER_MODULES")))
        raw["worker_specs"] = tuple(Path(p) for p in _csv(get("WORKER_SPECS")))
        raw["rate_limits"] = tuple(parse_rate_limits(get("RATE_LIMITS") or ""))
        if (v := get("TENANTS_FILE")) is not None:
            raw["tenants_file"] = Path(v)
            try:
                raw["tenants"] = load_tenants(Path(v))
            except TenantsFileError as e:
                raise SettingsError(f"{ENV_PREFIX}TENANTS_FILE: {e}") from None
        if (v := get("MCP_SERVERS_FILE")) is not None:
            raw["mcp_servers_file"] = Path(v)
            try:
                raw["mcp_servers"] = load_mcp_servers(Path(v))
            except McpServersFileError as e:
                raise SettingsError(f"{ENV_PREFIX}MCP_SERVERS_FILE: {e}") from None
        raw["caps"] = parse_caps(get)
        if "registry_secret" not in raw:
            raw["registry_secret"] = read_registry_secret(raw.get("data_dir", Path(".aiworker")))
        try:
            return cls.model_validate(raw)
        except ValidationError as e:
            lines = []
            for err in e.errors():
                field = str(err["loc"][0]) if err["loc"] else "?"
                lines.append(f"{ENV_PREFIX}{field.upper()}: {err['msg']}")
            raise SettingsError("; ".join(lines)) from None


def read_registry_secret(data_dir: Path) -> str | None:
    """The registry secret ``aiworker dev`` keeps in ``data_dir`` (so the clients
    beside a dev stack verify its entries), or None when there is none."""
    try:
        text = (data_dir / REGISTRY_SECRET_FILE).read_text("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text or None


def _unknown_setting(key: str, known: set[str]) -> str:
    """Why ``key`` is refused: the setting closest to it (difflib), or, when none is
    close, every setting there is."""
    close = difflib.get_close_matches(key.removeprefix(ENV_PREFIX), sorted(known), n=1)
    if close:
        return with_suggestion(f"{key}: unknown setting", ENV_PREFIX + close[0])
    every = ", ".join(ENV_PREFIX + k for k in sorted(known))
    return f"{key}: unknown setting (known: {every}; see docs/configuration.md)"


def parse_caps(get: Callable[[str], str | None]) -> Caps:
    """The ``AIWORKER_MAX_*`` caps; ``SettingsError`` names the variable and its bounds."""
    raw = {
        field: v
        for field, var in SETTING_OF.items()
        if (v := get(var.removeprefix(ENV_PREFIX))) is not None
    }
    try:
        return Caps.model_validate(raw)
    except ValidationError as e:
        lines = [f"{SETTING_OF[str(err['loc'][0])]}: {err['msg']}" for err in e.errors()]
        raise SettingsError("; ".join(lines)) from None


def parse_rate_limits(text: str) -> list[RateLimitRule]:
    """Parse ``web-scrape:acme=600/min,llm-call:*=60/min``."""
    rules = []
    for item in _csv(text):
        try:
            target, rate = item.split("=", 1)
            worker_id, tenant = target.split(":", 1)
            limit, period = parse_rate(rate)
        except ValueError as e:
            raise SettingsError(
                f"{ENV_PREFIX}RATE_LIMITS: {item!r} is not worker:tenant=N/period ({e})"
            ) from None
        rules.append(
            RateLimitRule(
                worker_id=worker_id.strip(),
                tenant=tenant.strip(),
                limit=limit,
                period_seconds=period,
            )
        )
    return rules

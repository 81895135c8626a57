"""What the generated docs say that no model or spec holds: when each error code
happens and what to do, what each setting means, the errors each built-in
worker raises and an example of its outputs.

Long on purpose (about 600 lines): tables of prose, one entry per
code, setting and worker, kept in one place so that none ships undocumented.

Kept beside the generator so that a new error code, setting, cap or built-in
worker without its line here fails ``python -m docgen check`` (and the docs
test) instead of shipping undocumented; example outputs are validated against
the worker's ``output_schema`` whenever the docs are generated.
"""

from __future__ import annotations

from typing import Any

# code -> (when it happens, what to do)
ERRORS: dict[str, tuple[str, str]] = {
    "invalid_input": (
        "a pipeline or a worker input breaks its schema, a reference does not resolve, a "
        "constraint is loosened, an unknown tenant or worker is named",
        "fix the input the message names (step, field, JSON path); retrying changes nothing",
    ),
    "invalid_output": (
        "a worker's outputs miss its output_schema (a model's reply that is not the JSON asked "
        "for, an external worker's malformed envelope)",
        "for llm-call and prompt workers add a `validate` loop or a `fallback`; for your own "
        "worker fix what it returns",
    ),
    "timeout": (
        "the worker's own deadline (timeout_seconds) passed, or no process polls an external "
        "worker's queue before the pipeline's deadline",
        "retried by itself; if it persists raise the step's budget or the worker's timeout, "
        "or start a worker process for the queue",
    ),
    "rate_limited": (
        "an upstream answered 429, or a rate limit would only grant a permit after the "
        "pipeline's deadline",
        "retried after Retry-After; lower the pipeline's pace or raise the limit "
        "(AIWORKER_RATE_LIMITS, the tenant's rate_limits)",
    ),
    "circuit_open": (
        "the host's or model provider's circuit breaker is open after repeated failures",
        "retried once the breaker's open period ends; look at why the upstream fails",
    ),
    "fetch_timeout": (
        "connecting to or reading a page timed out",
        "retried by itself; check that the site answers",
    ),
    "fetch_failed": (
        "a network error, a 5xx answer, or a corrupt compressed body",
        "retried by itself; check the site, then redrive the pipeline",
    ),
    "upstream_error": (
        "a model provider answered 5xx or something that is no reply, or the front door "
        "could not reach Temporal (HTTP 503)",
        "retried by itself; check the provider's status and AIWORKER_LLM_BASE_URL (the "
        "front door: retry after a while; check TEMPORAL_ADDRESS)",
    ),
    "access_denied": (
        "robots.txt disallows the URL, the site answered 401 or 403, a tenant read "
        "another tenant's artifact, or the front door refused an API key, a tenant or a "
        "webhook signature (HTTP 401/403)",
        "use a URL you may fetch (respect_robots: false only for sites you own)",
    ),
    "not_found": (
        "the page answered 404 or 410",
        "fix the URL (or the page), then `aiworker redrive` the pipeline",
    ),
    "egress_denied": (
        "the address is private, loopback, link-local or metadata, or outside an egress allow-list",
        "use a public address, or widen AIWORKER_EGRESS_ALLOW / the tenant's egress_allow "
        "(AIWORKER_ALLOW_PRIVATE_NETWORKS only in development)",
    ),
    "payload_too_large": (
        "a body, output or resolved value is over its limit (page 5 MiB, "
        "AIWORKER_MAX_RESOLVED_BYTES, ...)",
        "narrow what the step takes or produces; the limits page lists every cap",
    ),
    "tool_not_allowed": (
        "a worker called a tool outside its spec's tools_allowed",
        "a bug in the worker or its spec: add the tool to tools_allowed or stop calling it",
    ),
    "budget_exceeded": (
        "a step would exceed the pipeline's tokens, external calls, cost (max_cost_usd) or "
        "deadline; the pipeline ends budget_exhausted",
        "raise the pipeline's budget (within the tenant's ceiling) or make the steps cheaper",
    ),
    "validation_failed": (
        "a validator gate or a validation loop rejected the data; a gated step is blocked",
        "read the reasons in the step's result; fix the data or the schema, or approve it in "
        "review",
    ),
    "callback_failed": (
        "the other system failed a wait step's token (`aiworker callback TOKEN --fail MESSAGE` "
        "or POST /v1/callbacks/{token} with an error); the message is its reason",
        "see the message; `on_failure: continue` lets the pipeline go on without the step",
    ),
    "too_many_failures": (
        "more items of a for_each step failed than its `tolerated_failures`: no item started "
        "after that, those in flight were cancelled; the message counts failed, succeeded, "
        "cancelled, not started and tolerated items",
        "read the items' errors in the step's outputs; fix them and redrive (the succeeded "
        "items are kept), or raise `tolerated_failures`",
    ),
    "flow_refused": (
        "a pipeline start its `flow` did not take: `singleton: refuse` while a run holds "
        "the key, or the key's queue is full (docs/flow-control.md); nothing was started",
        "wait for the run named in the message to end, or cancel it; start again later",
    ),
    "quote_not_accepted": (
        "a start's cost quote (p95) is above the tenant's `quote_accept_above_usd` and the "
        "start did not accept it; nothing was started",
        "check the quote (`aiworker check --quote FILE`), then start again with "
        "`aiworker run --accept-quote`, `accept_quote: true` or `accept_quote=True`",
    ),
    "internal": (
        "an unexpected exception in a worker (a bug); logged with its traceback",
        "retried by itself; report it with the log line (trace_id) if it persists",
    ),
}

# Settings field -> meaning (the variable is AIWORKER_<FIELD>).
SETTINGS: dict[str, str] = {
    "data_dir": "dev server database, artifacts, sinks, publish ledger, payloads",
    "task_queues": "comma list of base task queues this process polls (empty: all)",
    "task_queue_suffix": "suffix on every task queue, to run isolated stacks on one cluster",
    "metrics_port": "port of /metrics, /healthz and /readyz (0: none)",
    "metrics_host": "address the metrics port listens on",
    "allow_private_networks": "allow egress to private and loopback addresses "
    "(development and tests only)",
    "egress_allow": "comma list of domains outbound calls may reach (empty: any public address)",
    "ui_url": "the Temporal Web UI's address, for the workflow links `aiworker run` prints "
    "(default: the UI of the `aiworker dev` stack in use, http://localhost:8233 when "
    "Temporal is at localhost:7233, else none)",
    "llm_base_url": "the `default` model alias: the provider's URL (OpenAI-style ends in /v1)",
    "llm_model": "the `default` model alias: the model name",
    "llm_api_key": "the `default` model alias: its API key (never logged)",
    "llm_provider": "the `default` model alias: `openai` (any OpenAI-compatible server) or "
    "`anthropic`",
    "models_file": "a JSON file of more model aliases",
    "local_model": "`aiworker dev` and `demo` start the bundled local model (llama.cpp's "
    "llama-server with SmolLM2-135M-Instruct) as the `default` alias when no model is "
    "configured; false turns that off (as `--no-model` does)",
    "local_model_file": "a GGUF model file on this machine for that local model instead of "
    "SmolLM2-135M-Instruct (nothing is downloaded; `aiworker dev` refuses a path that is "
    "not a GGUF file); see docs/local-model.md",
    "rate_limits": "rate limits per worker and tenant, e.g. "
    "`web-scrape:acme=600/min,llm-call:*=60/min`",
    "log_level": "level of the JSON log lines on stderr",
    "max_concurrent_activities": "activities one worker process runs at once",
    "max_concurrent_workflow_tasks": "workflow tasks one worker process runs at once",
    "pollers": "pollers per task queue and kind",
    "shutdown_grace_seconds": "drain time on SIGTERM before running activities are cancelled",
    "malloc_arenas": "the most glibc malloc arenas a worker process (`aiworker worker`, "
    "`dev`, `demo`) uses, set at start-up (as `MALLOC_ARENA_MAX` does): fewer arenas keep a "
    "long for_each's peak memory near the idle size. 0 keeps glibc's default (8 per core); "
    "an explicit `MALLOC_ARENA_MAX` wins; no effect on other C libraries",
    "local_activities": 'workers whose spec says `"execution": "local"` (validator, '
    "aggregator) run as local activities in the process that runs the pipeline; false runs "
    "every call as an activity on its task queue (each visible in the UI as its own events). "
    "Read when a pipeline starts and kept for that run: set it alike on every process polling "
    "aiworker-pipelines",
    "workflow_sandbox": "true runs aiworker's own workflows in the Temporal SDK's workflow "
    "sandbox too, as any other workflow on the worker runs; false (the default) runs them "
    "unsandboxed, which costs a pipeline about a third less worker CPU; their determinism is "
    "checked by replaying their histories in the sandbox in the test suite (docs/benchmarks.md)",
    "foreach_inline_items": "a `for_each` over more items keeps no item's outputs in the "
    "pipeline: its chunks store them in the artifact store and `outputs.items` in the result "
    'is a reference (`{"kind": "aiworker.items", "count", "parts"}`); a `${{ }}` '
    "reference to the list still sees the list. 0 sends every non-empty for_each by reference. "
    "Read when a pipeline starts and kept for that run",
    "versioning": "worker processes poll as a Worker Deployment version (deployment name "
    "plus build id): pipelines finish on the build they started on (deploy/README.md, "
    '"Rolling out new code"). Unset: on in `aiworker worker` and `dev`, off where '
    "workers are built in code (`build_workers` in embedded and test stacks)",
    "deployment_name": "Worker Deployment name; the deployment is this plus "
    "`AIWORKER_TASK_QUEUE_SUFFIX` (`.` as `-`), so an isolated stack is an isolated "
    "deployment (the Lambda worker uses it as given)",
    "build_id": "the build this process polls as; unset: the package version plus 12 hex "
    "digits of a SHA-256 over the workflow code and the schemas it imports "
    "(`aiworker.workers.process.deployments.build_id`)",
    "deployment_current": "who makes a build current (new pipelines go to the current "
    "build): `auto` the process, when the deployment has no current build yet; `always` the "
    "process (what `aiworker dev` does); `never` the operator (`aiworker deployment "
    "set-current`). A process whose build is not current says so on stderr",
    "registry_ttl_seconds": "how long a worker process's entry in the live worker registry "
    "lives unless refreshed; the process refreshes it every third of this while it polls and "
    "withdraws it when it stops gracefully (a killed process drops out after this long). "
    "0: the process does not publish (clients then check pipelines against local specs). "
    "See docs/registry.md",
    "registry_secret": "the deployment's live-registry secret (at least 16 characters; the "
    "same in every aiworker process of a deployment: workers, `serve`, the CLI). Entries are "
    "signed with it (HMAC-SHA256) and readers use only entries it verifies; a built-in "
    "worker's spec is never taken from an entry. Unset: `<data dir>/registry.secret` when "
    "present (`aiworker dev` writes one), else entries go out unsigned and this process "
    "uses no published spec, only its local ones. Never logged, never in a history. "
    "See docs/registry.md",
    "artifact_store": "`file` (under the data directory) or `s3://bucket/prefix`",
    "payload_threshold_bytes": "payloads this large or larger leave the history for the "
    "artifact store (0: all)",
    "breaker_failure_threshold": "failures of one host or provider within the window that "
    "open its circuit breaker",
    "breaker_window_seconds": "the sliding window those failures are counted in",
    "breaker_open_seconds": "how long an open breaker fails calls fast before one probe",
    "scrape_min_delay_seconds": "the least delay between request starts to one host (the "
    "floor; a robots.txt Crawl-delay above it wins)",
    "scrape_max_delay_seconds": "the most delay the autothrottle sets between request starts to "
    "one host, and the longest Retry-After it holds a host for",
    "autothrottle": "per-host delay follows the host's latency and 429/503 replies (Scrapy's "
    "AutoThrottle); false keeps the floor and Crawl-delay only",
    "autothrottle_target_concurrency": "requests the autothrottle aims to keep in flight per "
    "host: the delay tends to latency / this",
    "worker_modules": "comma list of importable modules with a `WORKERS` iterable",
    "worker_specs": "comma list of directories of prompt and external worker spec files",
    "tenants_file": "the tenant registry (JSON); with one, only its tenants exist",
    "mcp_servers_file": "the MCP servers an `llm-agent` may name as tools "
    "(`mcp:<server>/<tool>`): a JSON file, each server a stdio `command` or a streamable-HTTP "
    "`url`, with the tenants allowed (docs/mcp.md)",
    "serve_host": "address `aiworker serve` (the HTTP front door) listens on",
    "serve_port": "port of `aiworker serve`",
    "api_keys_file": "the front door's API keys (JSON: name, tenant, sha256 of the key, "
    "optional rate_limit); `aiworker keys add` writes it",
    "hooks_file": "the front door's webhooks (JSON: name, pipeline file, secret or secret_env, "
    "signature `github` or `stripe`, tenant)",
    "serve_rate_limit": "requests per API key and per webhook the front door accepts, e.g. "
    "`120/min` (a token bucket per process; a key's own rate_limit wins)",
    "serve_max_body_bytes": "the largest request body the front door reads (413 beyond it)",
    "serve_header_timeout_seconds": "seconds a request's headers may take to arrive, "
    "counted from the connection's start (or its last answer); 408 and closed beyond",
    "serve_body_timeout_seconds": "seconds a request's whole body may take to arrive after "
    "its headers; 408 and closed beyond",
    "serve_public_url": "the public base URL of `aiworker serve` (https://api.example.com): set "
    "it on the worker processes that run pipelines; a wait step's `callback_url` is built on it "
    "(unset: the path alone, /v1/callbacks/<token>; docs/callbacks.md)",
    "serve_max_connections": "connections the front door holds at once; one more is "
    "answered 503 and closed",
    "serve_max_streams_per_key": "event streams one API key holds open at once; one more is "
    "answered 429 with Retry-After",
    "serve_max_streams_per_tenant": "event streams one tenant's keys hold open at once; one "
    "more is answered 429 with Retry-After",
    "serve_stream_max_seconds": "how long an event stream lives; then the front door ends it "
    "and the client resumes with Last-Event-ID (an EventSource does so by itself)",
    "browser_executable": 'the Chromium that web-scrape\'s `render: "browser"` drives '
    "(Debian's `chromium` package; launched on first use, never downloaded)",
    "browser_max_in_flight": "requests one rendered page has out at once (images, scripts, "
    "styles, XHR); the others wait their turn, so one page cannot hold the fetch pool",
    "fetch_max_connections": "connections the fetch tool (web-scrape, the browser's requests, "
    "discovery) holds open at once in one worker process, every tenant's together",
    "fetch_tenant_share": "the part of those connections one tenant's fetches hold at once "
    "(0.5 of 100: 50), so one tenant cannot take them all; a fetch waiting for its "
    "tenant's share past its deadline is `fetch_timeout` (`reason: tenant_share`)",
}

# Settings fields that are not variables of their own.
DERIVED_SETTINGS = {
    "tenants": "read from AIWORKER_TENANTS_FILE",
    "mcp_servers": "read from AIWORKER_MCP_SERVERS_FILE",
    "caps": "AIWORKER_MAX_*",
}

# Fields of models outside schemas/pipeline.py that the result pages show.
FIELDS: dict[str, str] = {
    "Usage.input_tokens": "tokens sent to models, every attempt counted",
    "Usage.output_tokens": "tokens models produced, every attempt counted",
    "Usage.external_calls": "page fetches, model calls and webhook posts",
    "TenantRegistry.tenants": "every tenant there is, by name; a tenant not listed does not "
    "exist (`invalid_input`)",
}

# Terminal status of a pipeline -> what it means.
PIPELINE_STATUSES: dict[str, str] = {
    "succeeded": "every step succeeded (or was skipped by its `when`)",
    "partial": "it ran to the end, but a step was blocked by its gate, ended partial (a "
    "for_each with failed items), or failed under `on_failure: continue`",
    "failed": "a step failed and its `on_failure` was `fail`; `error` names it",
    "rejected": "a reviewer rejected an escalated step",
    "escalation_timed_out": "no review came within a step's `review_timeout_seconds`",
    "budget_exhausted": "a step would have exceeded the budget (`budget_exceeded`)",
    "cancelled": "the workflow was cancelled (`temporal workflow cancel`)",
}

# Status of a step -> what it means.
STATUSES: dict[str, str] = {
    "pending": "not started yet",
    "waiting": "waiting at a rate limit or concurrency limit",
    "running": "its worker is being called",
    "succeeded": "its worker (every item of a for_each) succeeded, or a reviewer approved it",
    "partial": "outputs with something missing: a worker's partial result, a for_each "
    "with failed items",
    "failed": "its worker failed (after its retries, validation loop and fallback); "
    "`error_code` says why",
    "skipped": "its `when` did not match, or a step it depends on did not succeed",
    "blocked": "its gate did not pass (error code `validation_failed`)",
    "awaiting_review": "escalated: waiting for `aiworker review`",
    "rejected": "a reviewer rejected it",
    "cancelled": "the pipeline was cancelled while it ran",
    "escalation_timed_out": "no review came within `review_timeout_seconds`",
}

# Caps field -> what it bounds.
CAPS: dict[str, str] = {
    "max_foreach_items": "items in one `for_each`",
    "max_steps": "steps in one pipeline",
    "max_json_depth": "nesting of pipeline inputs, step inputs, resolved values, worker "
    "inputs and outputs, JSON-LD (deeper JSON-LD is skipped with a `json_ld_too_deep` "
    "warning)",
    "max_reference_chars": "length of one string that holds `${{ }}` references",
    "max_references": "`${{ }}` references in one pipeline (and at most 100 in one string)",
    "max_resolved_bytes": "compact-JSON size of one resolved value: a step's input, one "
    "for_each item's input, a `when` value, the pipeline output, a rendered prompt",
    "max_foreach_bytes": "a for_each step's list and all its item inputs together",
}


class WorkerNotes:
    """What a built-in worker's page says beyond its spec."""

    def __init__(
        self,
        errors: dict[str, str],
        output: dict[str, Any],
        note: str = "",
        fields: dict[str, str] | None = None,
    ) -> None:
        self.errors = errors
        self.output = output
        self.note = note
        self.fields = fields or {}


WORKERS: dict[str, WorkerNotes] = {
    "web-scrape": WorkerNotes(
        errors={
            "invalid_input": "a bad URL, extraction_spec (selector, regex, locale) or header value",
            "egress_denied": "the address is not allowed by the egress policy",
            "access_denied": "robots.txt disallows the URL; 401 or 403",
            "not_found": "404 or 410",
            "fetch_timeout": "connecting or reading timed out, or no connection of the "
            "tenant's share of the fetch pool came free in time (`reason: tenant_share`); "
            "retried",
            "fetch_failed": "network error, 5xx, corrupt compressed body (retried)",
            "rate_limited": "429 with Retry-After (retried after it)",
            "circuit_open": "the host's breaker is open (retried after its wait)",
            "payload_too_large": "a page over 5 MiB, or an unknown Content-Encoding",
        },
        output={
            "data": {"title": "Example Domain"},
            "source": {
                "url": "https://example.com/",
                "final_url": "https://example.com/",
                "status_code": 200,
                "fetched_at": "2026-01-01T12:00:00Z",
                "content_type": "text/html",
                "encoding": "utf-8",
                "bytes": 1256,
                "sha256": "ea8fac7c65fb589b0d53560f5251f74f9e9b243478dcb6b3ea79b5e36449c8d9",
                "elapsed_ms": 84.2,
            },
            "warnings": [],
        },
        fields={
            "input.url": "the page to fetch (http or https)",
            "input.extraction_spec": "what to extract: fields by name, and/or page metadata",
            "input.extraction_spec.fields": "output field name -> how to find it (`data.<name>`)",
            "input.extraction_spec.fields.<name>": "a CSS selector, or an object as below",
            "input.extraction_spec.fields.<name>.selector": "CSS selector of the element(s)",
            "input.extraction_spec.fields.<name>.attr": "take this attribute instead of the text "
            "(`href`, `src`: made absolute for `type: url`)",
            "input.extraction_spec.fields.<name>.html": "take the element's inner HTML",
            "input.extraction_spec.fields.<name>.type": "convert the value; default `string`",
            "input.extraction_spec.fields.<name>.many": "every match as a list; default the first",
            "input.extraction_spec.fields.<name>.required": "no match makes the result "
            "`partial` (with a warning); otherwise null and a warning",
            "input.extraction_spec.fields.<name>.default": "the value when nothing matches "
            "or the text does not convert",
            "input.extraction_spec.fields.<name>.regex": "keep the first match (its first "
            "group, if any) of this RE2 pattern",
            "input.extraction_spec.fields.<name>.locale": "how numbers are written "
            "(`de-DE`: 1.234,5)",
            "input.extraction_spec.fields.<name>.fields": "a record per match, fields "
            "relative to it",
            "input.extraction_spec.metadata": "add `data.metadata`: title, description, canonical "
            "URL, language, OpenGraph, JSON-LD",
            "input.extraction_spec.content": "add `data.content`: `article` the main text "
            "(boilerplate removed), `page` all visible text; each as `text` and `markdown`, "
            "with title, byline, published date, language",
            "input.extraction_spec.max_content_chars": "cut `data.content.text` and `.markdown` "
            "to this many characters (a `truncated` warning)",
            "input.user_agent": "the User-Agent header (printable ASCII)",
            "input.discover": "find URLs for a `for_each` (`data.urls`): sitemaps and/or the "
            "page's links; see docs/scrape-discovery.md",
            "input.discover.sitemap": "`true`: the sitemaps robots.txt names, else /sitemap.xml; "
            "a URL: that sitemap (plain or gzip; an index's child sitemaps are read, one level)",
            "input.discover.links": '`true`: every `a[href]` of the page; `{"selector": CSS}`: '
            "the `href` of each match (or of the links inside it)",
            "input.discover.links.selector": "CSS selector of the link elements",
            "input.discover.pattern": "RE2 regular expression each absolute URL must contain a "
            "match of",
            "input.discover.same_site": "keep only URLs on the page's host (`www.` aside); "
            "default true",
            "input.discover.max_urls": "the most URLs returned (default 1000, at most 10000); "
            "reading stops there with a warning",
            "output.data": "the extracted fields by name (and `metadata`, `content`; `urls` with "
            "discover)",
            "output.data.urls": "with discover: the URLs found, in order, without duplicates, "
            "robots.txt applied",
            "output.source": "how the page was fetched",
            "output.source.url": "the URL asked for",
            "output.source.final_url": "the URL after redirects",
            "output.source.status_code": "the HTTP status",
            "output.source.fetched_at": "when (UTC)",
            "output.source.content_type": "the response's media type",
            "output.source.encoding": "the charset the page was decoded with",
            "output.source.bytes": "the body's size",
            "output.source.sha256": "the body's hash (the artifact's name)",
            "output.source.elapsed_ms": "fetch time",
            "output.source.redirects": "each URL redirected through",
            "output.warnings": "what is missing: a field with no match, skipped JSON-LD, "
            "no main content (`partial`), truncated content",
        },
        note="A field takes the element's normalized text unless `attr` names an attribute "
        "or `html` is true; `type` converts it; `many` takes every match; nested `fields` "
        "extract from each match. Selectors mean what they mean to BeautifulSoup and "
        "soupsieve. A spec whose selectors are all types, classes, ids, `*`, descendant "
        "and child combinators and lists, with no `html` field and no `metadata`, runs on "
        "lxml's own tree instead (the same results, about an eighth of the cost); "
        "a page with a `<template>` or odd whitespace goes to BeautifulSoup. The raw page "
        "goes to the artifact store (the step's `artifacts`).",
    ),
    "llm-call": WorkerNotes(
        errors={
            "invalid_input": "an unknown model alias, messages and prompt both or neither",
            "invalid_output": "the reply misses response_schema (with the validator's reasons)",
            "upstream_error": "5xx or a broken reply from the provider (retried)",
            "rate_limited": "429 from the provider, or its rpm/tpm limit (retried)",
            "timeout": "the call's deadline passed (retried)",
            "budget_exceeded": "the prompt and max_tokens do not fit the step's token share",
            "access_denied": "the provider refused the API key",
            "circuit_open": "the provider's breaker is open (retried after its wait)",
            "payload_too_large": "a reply over 8 MiB",
        },
        output={
            "text": '{"category": "billing"}',
            "json": {"category": "billing"},
            "finish_reason": "stop",
            "model": "gpt-4o-mini-2024-07-18",
            "alias": "small",
            "usage": {"input_tokens": 182, "output_tokens": 9},
        },
        fields={
            "input.messages[].role": "who speaks",
            "input.messages[].content": "the text",
            "input.temperature": "sampling temperature",
            "input.stop": "stop sequences",
            "input.seed": "a seed, for providers that take one",
            "output.text": "the reply as text",
            "output.finish_reason": "why the model stopped (`stop`, `length`, ...)",
            "output.alias": "the alias the call named",
            "output.usage": "tokens the provider billed",
        },
        note="`model` names an alias (`default` from AIWORKER_LLM_*, more from "
        "AIWORKER_MODELS_FILE), never a provider or a key.",
    ),
    "llm-agent": WorkerNotes(
        errors={
            "budget_exceeded": "a bound was reached: max_turns, a tool's max_calls, the step's "
            "token or external-call share, or the deadline (`reasons[0].resource` names it; "
            "the transcript so far is in the outputs)",
            "invalid_input": "the input fails the schema, or `tools` names an unknown worker",
            "invalid_output": "never for the answer itself: a final answer that misses "
            "response_schema goes back to the model as one more turn",
            "upstream_error": "a model turn failed after its retries (as llm-call)",
            "timeout": "a model turn ran out of its own time after its retries",
        },
        output={
            "answer": "The page says the kettle costs 39.90.",
            "stopped": "answer",
            "turns": 3,
            "tool_calls": 2,
            "tool_errors": 0,
            "calls": {"web-scrape": 1, "validator": 1},
            "errors": {},
            "transcript": [
                {"role": "user", "content": "What does the kettle cost?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"id": "call_1", "name": "web-scrape", "arguments": {"url": "..."}}
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "name": "web-scrape", "content": "..."},
            ],
        },
        fields={
            "input.tools": "the allow-list: each a worker id, or `{worker, max_calls}`",
        },
        note="Runs as a child workflow, not an activity: each model turn is an llm-call "
        "activity and each tool call the tool worker's own activity (its contract, retries "
        "and idempotency key `<step key>/turn-<n>/call-<i>`). A tool the model names that is "
        "not allowed, or arguments that fail the tool's input schema, come back to the model "
        "as a tool error. See [the agent guide](../../agent.md).",
    ),
    "validator": WorkerNotes(
        errors={
            "invalid_input": "the schema is no valid JSON Schema, or fetches a remote $ref",
            "validation_failed": 'with `"gate": true`, data that does not match (the reasons '
            "in the error's details)",
        },
        output={"valid": True, "errors": []},
        fields={
            "input.max_errors": "report at most this many problems",
            "output.valid": "the data matches the schema",
            "output.errors": "one entry per problem",
            "output.errors[].path": "where in the data, as a JSON path (`$.price`)",
            "output.errors[].message": "what is wrong",
            "output.errors[].validator": "the schema keyword that failed (`type`, `required`)",
            "output.errors[].schema_path": "where in the schema",
            "output.truncated": "more problems than max_errors",
        },
        note="Without `gate` an invalid value is a result, not a failure: `valid` is false "
        "and `errors` holds one entry per problem (`path`, `message`, `validator`, "
        "`schema_path`). A step's `gate` names a validator step.",
    ),
    "aggregator": WorkerNotes(
        errors={
            "invalid_input": "no branches, a policy without what it needs (quorum without "
            "`quorum`), a merge branch that is no object",
            "validation_failed": "`all` with a failed branch, `first_success` with none, no "
            'quorum or majority, a merge conflict with `"conflict": "error"`',
        },
        output={
            "policy": "merge",
            "result": {"title": "Kettle", "price": 39.5},
            "used": ["shop", "catalog"],
            "failed": [],
            "conflicts": [],
        },
        fields={
            "input.policy": "how branches are combined",
            "input.conflict": "merge: which value wins when branches disagree on a key",
            "output.policy": "the policy applied",
            "output.result": "the merged value",
            "output.votes": "quorum, majority: votes per value (compact JSON)",
            "output.conflicts": "merge: keys the branches disagreed on",
            "output.duplicates_removed": "concat: items dropped by dedupe_key",
        },
        note="Policies: `all` (every branch), `first_success`, `quorum` and `majority` "
        "(vote on `field`), `merge` (objects; conflicts by `conflict`), `concat` (lists, "
        "deduplicated by `dedupe_key`). A null branch counts as failed; disagreements "
        "become warnings naming the branches.",
    ),
    "publish": WorkerNotes(
        errors={
            "invalid_input": "a sink path that leaves the tenant's directory; the same "
            "idempotency key published before to another sink",
            "egress_denied": "the webhook's address is not allowed",
            "fetch_failed": "the webhook answered 5xx or the network failed (retried)",
            "fetch_timeout": "the webhook did not answer in time (retried)",
            "rate_limited": "the webhook answered 429 (retried after Retry-After)",
            "access_denied": "the webhook answered 401 or 403",
            "not_found": "the webhook answered 404 or 410",
        },
        output={
            "published": True,
            "duplicate": False,
            "idempotency_key": "product-watch-3f2a/notify",
            "sink": "file:products.jsonl",
        },
        fields={
            "input.sink": 'where to: `{"file": <path>}` or `{"webhook": <url>}`',
            "input.sink.file": "a JSONL file under the tenant's sink directory",
            "input.sink.webhook": "a URL that gets the record as a POST",
            "output.idempotency_key": "the key it was published under",
            "output.sink": "where it went (`file:<path>` or the URL)",
            "output.status_code": "the webhook's HTTP status",
        },
        note="A file sink appends one JSON line to `<data dir>/sinks/<tenant>/<file>`; a "
        "webhook gets a POST with an `Idempotency-Key` header. Each idempotency key is "
        "published once: a retry, a replay or a redrive reports `duplicate: true` and "
        "writes nothing. Within a pipeline the key is `<workflow id>/<step id>`, so "
        "starting a pipeline again under the same fixed workflow id publishes nothing new.",
    ),
    "mcp-call": WorkerNotes(
        errors={
            "invalid_input": "an MCP server that AIWORKER_MCP_SERVERS_FILE does not declare",
            "access_denied": "the tenant is not among the server's `tenants`",
            "timeout": "connecting, listing or the tool call took longer than the server's "
            "`timeout_seconds` (a stdio server is killed; retried)",
            "upstream_error": "the server exited or dropped the connection (retried)",
            "payload_too_large": "a message of the server over its `max_response_bytes` "
            "(the read stops there; a stdio server is killed)",
            "invalid_output": "a tool's input or output schema is not a valid, safe JSON "
            "Schema, more than 128 tools, or structured content that misses the tool's "
            "own output schema",
            "egress_denied": "an HTTP server's address is not allowed by the egress policy",
        },
        output={
            "server": "calc",
            "text": '{"sum": 42}',
            "structured": {"sum": 42},
            "is_error": False,
        },
        fields={
            "input.op": "`list_tools` or `call_tool`",
            "output.tools": "`list_tools`: each tool's name, description and schemas",
        },
        note="What `llm-agent` runs for its tools named `mcp:<server>/<tool>` (docs/mcp.md): "
        "one activity per listing and per tool call. A stdio server is started for each "
        "call and stopped by its PID before the call ends; an HTTP server is reached "
        "through the egress guard.",
    ),
}

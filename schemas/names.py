"""Names that the whole system shares: task queues, workflows, activities,
search attributes. No other module spells one of these as a literal.
"""

from __future__ import annotations

from typing import Final

from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    TypedSearchAttributes,
)

# Task queues (kebab-case). A deployment may add a suffix to every queue
# (``AIWORKER_TASK_QUEUE_SUFFIX``) to run an isolated stack on one cluster;
# the pipeline workflow derives the suffix from its own queue.
PIPELINES_QUEUE: Final = "aiworker-pipelines"
SCRAPE_QUEUE: Final = "aiworker-scrape"
LLM_QUEUE: Final = "aiworker-llm"

# Workflow types.
PIPELINE_WORKFLOW: Final = "PipelineWorkflow"
FOREACH_WORKFLOW: Final = "PipelineForEachWorkflow"
# An llm-agent step: its model turns and tool calls, each an activity of its own.
AGENT_WORKFLOW: Final = "AgentWorkflow"

# Activity names are the worker ids; never renamed once released.
VALIDATOR: Final = "validator"
AGGREGATOR: Final = "aggregator"
WEB_SCRAPE: Final = "web-scrape"
LLM_CALL: Final = "llm-call"
PUBLISH: Final = "publish"
# Not an activity: a step of this worker runs as AgentWorkflow (a child workflow).
LLM_AGENT: Final = "llm-agent"
# MCP servers' tool listings and calls for llm-agent (schemas/mcp.py)
MCP_CALL: Final = "mcp-call"

# Custom search attributes (Keyword) registered by `aiworker dev` and tests.
SA_STATUS: Final = "AiworkerStatus"
SA_TENANT: Final = "AiworkerTenant"
SA_PIPELINE: Final = "AiworkerPipeline"
# the stable error code a failed or partial pipeline ended with (its first failed
# step's), set when it ends; bulk actions filter on it (docs/operations.md)
SA_ERROR_CODE: Final = "AiworkerErrorCode"
SEARCH_ATTRIBUTES: Final = (SA_STATUS, SA_TENANT, SA_PIPELINE, SA_ERROR_CODE)
STATUS_KEY: Final = SearchAttributeKey.for_keyword(SA_STATUS)
TENANT_KEY: Final = SearchAttributeKey.for_keyword(SA_TENANT)
PIPELINE_KEY: Final = SearchAttributeKey.for_keyword(SA_PIPELINE)
ERROR_CODE_KEY: Final = SearchAttributeKey.for_keyword(SA_ERROR_CODE)

# What a tenant may be called, everywhere a tenant arrives (pipeline specs, worker
# requests, CLI flags): safe as a path component (file sinks live under
# ``sinks/<tenant>/``), as a limiter key and inside a visibility query.
TENANT_PATTERN: Final = r"^[a-z0-9][a-z0-9._-]{0,62}$"
DEFAULT_TENANT: Final = "default"

# Temporal's task priority keys as a pipeline's ``priority`` takes them: the server's
# default ``matching.priorityLevels`` (5) levels, 1 first; unset is the middle one (3).
PRIORITY_HIGHEST: Final = 1
PRIORITY_LOWEST: Final = 5


def pipeline_search_attributes(status: str, tenant: str, pipeline: str) -> TypedSearchAttributes:
    """The search attributes a pipeline workflow carries: status, tenant, pipeline name."""
    return TypedSearchAttributes(
        [
            SearchAttributePair(STATUS_KEY, status),
            SearchAttributePair(TENANT_KEY, tenant),
            SearchAttributePair(PIPELINE_KEY, pipeline),
        ]
    )


# The statuses in which a call, a step or a pipeline counts as done well.
OK_STATUSES: Final = ("succeeded", "partial")
# The step statuses after which a step no longer changes (progress counts them done).
ENDED_STEP_STATUSES: Final = frozenset(
    (
        *OK_STATUSES,
        "failed",
        "skipped",
        "blocked",
        "rejected",
        "cancelled",
        "escalation_timed_out",
    )
)

# The header in which the SDK's OpenTelemetry TracingInterceptor carries the
# W3C trace context into workflows and activities.
TRACE_HEADER: Final = "_tracer-data"

# Queries and updates of the pipeline workflow.
PROGRESS_QUERY: Final = "progress"
# The run's numbered step events after a number (the live event stream reads it).
EVENTS_QUERY: Final = "events"
REVIEW_UPDATE: Final = "review"
# A wait step's tokens: completed, failed or extended by this Update; after the run
# ended, the query of the same name says what became of a token.
CALLBACK_UPDATE: Final = "callback"
CALLBACK_QUERY: Final = "callback"
# The local activity that draws a wait step's secrets (and reads the public URL).
CALLBACK_TOKENS: Final = "callback-tokens"


def queue_suffix_of(task_queue: str) -> str:
    """The deployment suffix of a pipelines queue (``aiworker-pipelines-x`` -> ``-x``)."""
    if task_queue.startswith(PIPELINES_QUEUE):
        return task_queue[len(PIPELINES_QUEUE) :]
    return ""


# Limits that hold across worker processes (see workflows/limits.py).
LIMITER_WORKFLOW: Final = "LimiterWorkflow"
LIMITER_ACQUIRE: Final = "limiter-acquire"
# The requests of one workflow task of a for_each chunk, asked together.
LIMITER_ACQUIRE_MANY: Final = "limiter-acquire-many"
# The for_each item outputs by reference (activities/items.py): a leaf chunk stores
# its items' outputs, a pipeline loads them where a reference needs the list.
STORE_ITEMS: Final = "foreach-store-items"
LOAD_ITEMS: Final = "foreach-load-items"
# The run config: what the process's settings and catalog say about one pipeline
# run, asked once at its start (a local activity, so the run decides from its record).
RUN_CONFIG: Final = "run-config"
LIMITER_ACQUIRE_SIGNAL: Final = "acquire"
LIMITER_RELEASE_SIGNAL: Final = "release"
PERMIT_SIGNAL: Final = "permit"
# The limiter asks a lease's holder, before taking an expired lease back, whether it
# still holds it: the signal fails when the holder's workflow is gone.
LEASE_CHECK_SIGNAL: Final = "lease-check"
# A worker process leases a block of rate permits for its own pool (an update: the
# limiter answers how many it grants, at once, or refuses).
LIMITER_BLOCK_UPDATE: Final = "lease-block"
# Histogram (seconds) of permit waits, recorded by LimiterWorkflow through the SDK meter.
LIMITER_WAIT_METRIC: Final = "aiworker_limiter_wait"


def limiter_workflow_id(key: str, queue_suffix: str = "") -> str:
    """The id of the limiter workflow that owns one limit key in one deployment."""
    return f"aiworker-limiter{queue_suffix}/{key}"


SHARED_BREAKER_WORKFLOW: Final = "SharedBreakerWorkflow"
BREAKER_OPENED_SIGNAL: Final = "opened"
BREAKER_STATE_QUERY: Final = "state"
# The memo key where SharedBreakerWorkflow keeps its open-until time (epoch seconds).
BREAKER_MEMO_KEY: Final = "open_until"
# Half-open across processes: a process asks the breaker workflow for the one probe
# lease (an update answering ``ProbeAnswer``), and tells it when the probe succeeded.
BREAKER_PROBE_UPDATE: Final = "probe"
BREAKER_CLOSED_SIGNAL: Final = "closed"
# The memo key where SharedBreakerWorkflow keeps ``{"closed", "lease_until"}``.
BREAKER_PROBE_MEMO_KEY: Final = "probe"


def shared_breaker_workflow_id(key: str, queue_suffix: str = "") -> str:
    """The id of the workflow that shares one breaker (``host:example.com``) across processes."""
    return f"aiworker-breaker{queue_suffix}/{key}"


# The live worker registry (workflows/worker_registry.py): what each worker process
# serves, published by the process, read by every client.
WORKER_REGISTRY_WORKFLOW: Final = "WorkerRegistryWorkflow"
REGISTRY_PUBLISH_UPDATE: Final = "publish"
REGISTRY_WITHDRAW_SIGNAL: Final = "withdraw"
REGISTRY_ENTRIES_QUERY: Final = "entries"


def worker_registry_workflow_id(queue_suffix: str = "") -> str:
    """The id of the registry workflow of one deployment (a queue family) in a namespace."""
    return f"aiworker-registry{queue_suffix}"


# Flow control on pipeline starts (workflows/flow.py): one workflow per (tenant,
# pipeline, key), its id from schemas/flow.py ``flow_workflow_id``; every start is its
# ``start`` update (sent with update-with-start), answered with a FlowAnswer.
FLOW_WORKFLOW: Final = "PipelineFlowWorkflow"
FLOW_START_UPDATE: Final = "start"
FLOW_STATE_QUERY: Final = "state"
# A schedule's run of a pipeline that declares ``flow``: the server starts this
# small workflow, whose one activity sends the start through the key's flow
# (workers/schedules/flow_starts.py), as ``aiworker run`` would.
FLOW_SCHEDULED_WORKFLOW: Final = "ScheduledFlowStart"
FLOW_SUBMIT_ACTIVITY: Final = "flow-submit"
# Evals (workers/evals, workflows/evals.py): one eval run of a candidate over a
# dataset of recorded calls is one workflow on the pipelines queue; a candidate
# given as a spec (a prompt worker's new version, or another model alias) runs
# through the ``eval-call`` activity, served beside its task queue's workers.
EVAL_WORKFLOW: Final = "EvalWorkflow"
EVAL_CALL: Final = "eval-call"
EVAL_PROGRESS_QUERY: Final = "eval-progress"

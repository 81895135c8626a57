"""The whole check of a pipeline before it starts: the spec, then this process's settings.

:func:`check_spec` is the one code path of ``aiworker check``, ``aiworker run``
and :meth:`~aiworker.workers.client.client.PipelineClient.start`: first the
settings-free check (:func:`~aiworker.schemas.pipeline_check.parse_pipeline`
with the workers' specs, the same check the workflow runs at start), then
what only a process's settings know:

- **model aliases**: an llm-call step's ``model`` (``default`` when left out)
  and a prompt worker's alias must be one the live workers publish
  (``aliases``, from the live registry), else one this process configures
  (``AIWORKER_LLM_*`` for ``default``, ``AIWORKER_MODELS_FILE`` for the
  rest). A process that configures no model at all is not where the models
  live, and checks no alias.
- **tenants**: with a registry (``AIWORKER_TENANTS_FILE``), the pipeline's
  tenant must be listed and may call only its allowed workers.
- **MCP servers**: with a servers file (``AIWORKER_MCP_SERVERS_FILE``), each
  ``mcp:<server>/...`` an llm-agent step names must be a server there that
  allows the pipeline's tenant. Whether the server lists the tool is known only
  when the agent lists it. A process without the file checks no server.

Workers run with their own settings; where those differ from the checking
process's, the worker's call still refuses what it does not know.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.agent import mcp_refs
from aiworker.schemas.caps import Caps
from aiworker.schemas.messages import suggest
from aiworker.schemas.pipeline import PipelineSpec, Step
from aiworker.schemas.pipeline_check import PipelineSpecError, Workers, parse_pipeline
from aiworker.schemas.problems import Problem
from aiworker.schemas.refs import find_refs
from aiworker.schemas.spec import PromptImplementation, WorkerSpec
from aiworker.schemas.tenants import refused_workers


def model_aliases(settings: Settings) -> set[str] | None:
    """The model aliases ``settings`` configure; None when they configure no model.

    Reads the models file for its alias names only: keys are the workers' to load.

    Raises:
        ModelsFileError: the models file cannot be read or is malformed.
    """
    from aiworker.activities.llm import ModelsFileError, parse_models_file

    aliases: set[str] = set()
    if settings.llm_base_url or settings.llm_model or settings.llm_api_key:
        aliases.add("default")
    if settings.models_file is not None:
        source = f"AIWORKER_MODELS_FILE {str(settings.models_file)!r}"
        try:
            text = settings.models_file.read_text("utf-8")
        except OSError as e:
            raise ModelsFileError(f"{source} cannot be read ({e.strerror})") from None
        aliases |= set(parse_models_file(text, source).models)
    elif not aliases:
        return None
    return aliases


def _alias_of(step: Step, worker_id: str, value: Any, spec: WorkerSpec | None) -> Any:
    """The alias a call of ``worker_id`` with ``value`` names, or None when it names
    none or a reference decides it."""
    if spec is not None and isinstance(spec.implementation, PromptImplementation):
        return spec.implementation.model
    if worker_id != names.LLM_CALL or not isinstance(value, dict):
        return None
    alias = value.get("model", "default")
    return alias if isinstance(alias, str) and not find_refs(alias) else None


def alias_problems(
    spec: PipelineSpec, specs: Mapping[str, WorkerSpec | None], aliases: set[str]
) -> list[Problem]:
    """Each step (or fallback) that names a model alias not in ``aliases``."""
    problems = []
    for i, step in enumerate(spec.steps):
        calls = [("input", step.worker, step.input)]
        if step.fallback is not None:
            field = "fallback_input" if step.fallback_input is not None else "input"
            fb_input = step.fallback_input if step.fallback_input is not None else step.input
            calls.append((field, step.fallback, fb_input))
        for field, worker_id, value in calls:
            worker = specs.get(worker_id)
            alias = _alias_of(step, worker_id, value, worker)
            if alias is None or alias in aliases:
                continue
            known = ", ".join(sorted(aliases)) or "none configured"
            if worker is not None and isinstance(worker.implementation, PromptImplementation):
                at, what = "worker", f"worker {worker_id!r} uses unknown model alias {alias!r}"
            else:
                at, what = f"{field}.model", f"unknown model alias {alias!r}"
            problems.append(
                Problem(step.id, at, f"{what} (known: {known})", suggest(alias, aliases), i)
            )
    return problems


def tenant_problems(spec: PipelineSpec, settings: Settings) -> list[Problem]:
    """The pipeline's tenant against the registry, when there is one."""
    registry = settings.tenants
    if registry is None:
        return []
    policy = registry.policy(spec.tenant)
    if policy is None:
        known = sorted(registry.tenants)
        listed = ", ".join(known[:20]) + (", ..." if len(known) > 20 else "")
        return [
            Problem(
                None,
                "tenant",
                f"unknown tenant {spec.tenant!r} (known: {listed})",
                suggest(spec.tenant, known),
            )
        ]
    return refused_workers(spec, policy)


def mcp_problems(spec: PipelineSpec, settings: Settings) -> list[Problem]:
    """The MCP servers the llm-agent steps of ``spec`` name literally, against the
    servers file (none without one): an unknown server, a tenant it does not allow."""
    servers = settings.mcp_servers
    if servers is None:
        return []
    problems = []
    for i, step in enumerate(spec.steps):
        tools = step.input.get("tools") if isinstance(step.input, dict) else None
        if step.worker != names.LLM_AGENT or not isinstance(tools, list):
            continue
        for ref in mcp_refs(tools)[0]:
            server = servers.servers.get(ref.server)
            if server is None:
                known = sorted(servers.servers)
                problems.append(
                    Problem(
                        step.id,
                        ref.field,
                        f"unknown MCP server {ref.server!r} (known: {', '.join(known) or 'none'})",
                        suggest(ref.server, known),
                        index=i,
                    )
                )
            elif not server.allows(spec.tenant):
                problems.append(
                    Problem(
                        step.id,
                        ref.field,
                        f"tenant {spec.tenant!r} may not use MCP server {ref.server!r} "
                        "(its 'tenants' in AIWORKER_MCP_SERVERS_FILE)",
                        index=i,
                    )
                )
    return problems


def settings_problems(
    spec: PipelineSpec,
    settings: Settings,
    specs: Mapping[str, WorkerSpec | None],
    aliases: set[str] | None = None,
) -> list[Problem]:
    """What of ``spec`` this process's settings refuse: tenants, then model aliases
    (``aliases`` when given: the live workers' aliases, else the settings')."""
    problems = tenant_problems(spec, settings) + mcp_problems(spec, settings)
    if aliases is None:
        aliases = model_aliases(settings)
    if aliases is not None:
        problems += alias_problems(spec, specs, aliases)
    return problems


def check_spec(
    raw: Any,
    workers: Workers,
    settings: Settings,
    caps: Caps | None = None,
    *,
    aliases: set[str] | None = None,
) -> PipelineSpec:
    """Check a pipeline as a whole before it starts: the spec (with the workers'
    specs when ``workers`` maps ids to them), then the settings' part; model
    aliases against ``aliases`` when given (the live registry's), else the settings'.

    Raises:
        PipelineSpecError: every problem found, each naming step, field and JSON path.
        ModelsFileError: the models file the settings name is unusable.
    """
    problems: list[Problem] = []
    try:
        spec = parse_pipeline(raw, workers, settings.caps if caps is None else caps)
    except PipelineSpecError as e:
        # A spec whose fields parse is checked against the settings too: every
        # problem in one go.
        try:
            spec = PipelineSpec.model_validate(raw)
        except ValidationError:
            raise e from None
        problems = e.details
    specs: Mapping[str, WorkerSpec | None] = workers if isinstance(workers, Mapping) else {}
    problems += settings_problems(spec, settings, specs, aliases)
    if problems:
        raise PipelineSpecError(problems)
    return spec


__all__ = [
    "alias_problems",
    "check_spec",
    "mcp_problems",
    "model_aliases",
    "settings_problems",
    "tenant_problems",
]

"""Language-model providers for the ``llm-call`` worker.

The public surface: :class:`LanguageModel` (the ``language_model`` tool),
the model registry (:func:`load_registry`, :class:`ModelRegistry`,
:class:`ModelConfig`, :class:`ModelsFileError`), the per-endpoint
:class:`EndpointRateLimiter`, and the provider-neutral :class:`ChatRequest` /
:class:`ChatReply` (whose usage is the protocol's ``Usage`` plus an
``estimated`` flag, :class:`ReplyUsage`), with tool use (:class:`ToolDef`,
:class:`ToolCall`; each wire format in ``_tools``), and
:class:`StreamProgress`, what a streaming call has received so far.
"""

from aiworker.activities.limits import EndpointRateLimiter
from aiworker.activities.llm._client import LanguageModel, LlmMetrics, estimate_tokens
from aiworker.activities.llm._progress import StreamProgress
from aiworker.activities.llm._providers import PROVIDERS, AnthropicProvider, OpenAIProvider
from aiworker.activities.llm._registry import (
    ModelConfig,
    ModelEntry,
    ModelRegistry,
    ModelsFile,
    ModelsFileError,
    load_registry,
    parse_models_file,
)
from aiworker.activities.llm._tools import call_to_json, message_from_json, tool_def_from_json
from aiworker.activities.llm._types import (
    ChatReply,
    ChatRequest,
    Message,
    ReplyUsage,
    ToolCall,
    ToolDef,
)
from aiworker.activities.retry_after import parse_duration, retry_after

__all__ = [
    "PROVIDERS",
    "AnthropicProvider",
    "ChatReply",
    "ChatRequest",
    "EndpointRateLimiter",
    "LanguageModel",
    "LlmMetrics",
    "Message",
    "ModelConfig",
    "ModelEntry",
    "ModelRegistry",
    "ModelsFile",
    "ModelsFileError",
    "OpenAIProvider",
    "ReplyUsage",
    "StreamProgress",
    "ToolCall",
    "ToolDef",
    "call_to_json",
    "estimate_tokens",
    "load_registry",
    "message_from_json",
    "parse_duration",
    "parse_models_file",
    "retry_after",
    "tool_def_from_json",
]

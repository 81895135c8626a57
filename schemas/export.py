"""Exported JSON Schemas of the protocol envelopes (``schemas/json/``).

``aiworker schemas export`` writes them; CI runs ``check`` (via the tests)
so the published files never drift from the pydantic models and specs. The
generated docs pages (``docs/reference/``) come from ``docgen/`` in the source
tree (``make docs``), which is not installed.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel

from aiworker.schemas.pipeline import PipelineResult, PipelineSpec
from aiworker.schemas.protocol import ErrorInfo, WorkerRequest, WorkerResponse
from aiworker.schemas.spec import WorkerSpec

MODELS: dict[str, type[BaseModel]] = {
    "worker-request": WorkerRequest,
    "worker-response": WorkerResponse,
    "error-info": ErrorInfo,
    "worker-spec": WorkerSpec,
    "pipeline-spec": PipelineSpec,
    "pipeline-result": PipelineResult,
}

JSON_DIR = Path(__file__).parent / "json"


def render(model: type[BaseModel]) -> str:
    """The canonical text of one exported schema."""
    schema = model.model_json_schema(by_alias=True)
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def export(folder: Path = JSON_DIR) -> list[Path]:
    """Write every schema; returns the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name, model in MODELS.items():
        p = folder / f"{name}.schema.json"
        p.write_text(render(model), "utf-8")
        out.append(p)
    return out


def check(folder: Path = JSON_DIR) -> list[str]:
    """Differences between the files and the models; empty when in sync."""
    drift = []
    for name, model in MODELS.items():
        p = folder / f"{name}.schema.json"
        if not p.exists():
            drift.append(f"{p} is missing; run `aiworker schemas export`")
        elif p.read_text("utf-8") != render(model):
            drift.append(f"{p} differs from {model.__name__}; run `aiworker schemas export`")
    return drift

"""One versioning mechanism per workflow (docs/replay.md, "Patches and their plans").

A pinned workflow (pipeline, for_each chunk, agent, eval, conformance: every
workflow a versioned worker process runs without an override) ends on the build
it started on, so it never calls ``workflow.patched``: a change is a new build.
Only the workflows started with an auto-upgrade override move to a newer build
mid-run, and only their own methods may patch, each patch with its plan to
``deprecate_patch`` and remove written beside its id. Read from the source, so a
patch added in a helper module that a pinned workflow runs fails here, before a
history shows it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import aiworker.workflows

# The workflows started with ``AutoUpgradeVersioningOverride`` (activities/limits.py,
# activities/breakers.py, workers/process/live_registry.py, workers/client/flow_start.py).
AUTO_UPGRADE = {
    "LimiterWorkflow",
    "SharedBreakerWorkflow",
    "WorkerRegistryWorkflow",
    "PipelineFlowWorkflow",
}
FOLDER = Path(aiworker.workflows.__file__).parent


def _patch_calls(tree: ast.Module) -> list[tuple[str | None, ast.Call]]:
    """Every ``workflow.patched(...)`` call with the class it is written in (None:
    module level or a plain function)."""
    found: list[tuple[str | None, ast.Call]] = []

    def visit(node: ast.AST, cls: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, child.name)
                continue
            if (
                isinstance(child, ast.Call)
                and isinstance(child.func, ast.Attribute)
                and child.func.attr == "patched"
                and isinstance(child.func.value, ast.Name)
                and child.func.value.id == "workflow"
            ):
                found.append((cls, child))
            visit(child, cls)

    visit(tree, None)
    return found


def _modules() -> dict[str, ast.Module]:
    return {p.name: ast.parse(p.read_text("utf-8")) for p in sorted(FOLDER.glob("*.py"))}


def test_only_auto_upgrade_workflows_call_patched() -> None:
    outside = [
        f"{name}:{call.lineno} in {cls or 'a function'}"
        for name, tree in _modules().items()
        for cls, call in _patch_calls(tree)
        if cls not in AUTO_UPGRADE
    ]
    assert outside == []


def test_the_auto_upgrade_workflows_are_the_ones_started_with_the_override() -> None:
    # the set above is a claim about the code that starts them: hold it to that code
    package = FOLDER.parent
    starters = [
        "activities/limits.py",
        "activities/breakers.py",
        "workers/process/live_registry.py",
        "workers/client/flow_start.py",
    ]
    for path in starters:
        assert "AutoUpgradeVersioningOverride()" in (package / path).read_text("utf-8"), path
    defined = {
        node.name
        for tree in _modules().values()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }
    assert AUTO_UPGRADE <= defined


def test_every_patch_has_its_plan_beside_it() -> None:
    """Each patched module states stage 3 (``deprecate_patch``) and stage 4 (removal)
    with the build and date of each, and each id is a named constant."""
    for name, tree in _modules().items():
        calls = _patch_calls(tree)
        if not calls:
            continue
        text = (FOLDER / name).read_text("utf-8")
        for stage in ("stage 3 -- build ", "deprecate_patch", "stage 4 -- build "):
            assert stage in text, (name, stage)
        for _, call in calls:
            assert isinstance(call.args[0], ast.Name), f"{name}:{call.lineno}: a literal id"

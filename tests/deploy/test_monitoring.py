"""deploy/monitoring: promtool accepts the config and rules, the alert unit
tests pass, and every metric the rules and dashboard query is one the workers
export (activities/metrics.py) or one documented for the orchestration side.
"""

from __future__ import annotations

import json
import re
import shutil
from typing import Any

import pytest
import yaml
from deploy_tools import DEPLOY, ROOT, run
from prometheus_client import CollectorRegistry

from aiworker.activities.metrics import WorkerMetrics
from aiworker.schemas import names
from aiworker.workers.process.telemetry import PIPELINES_METRIC

MON = DEPLOY / "monitoring"
# Exported by the pipeline orchestration, not by the worker runtime (see deploy/README.md).
ORCHESTRATION_METRICS: set[str] = set()
# Counted in workflow code through the SDK's metric meter and served on the same
# /metrics by workers.process.telemetry (not a prometheus_client metric of the runtime).
SDK_METER_METRICS = {
    PIPELINES_METRIC + "_total",
    *(f"{names.LIMITER_WAIT_METRIC}_seconds{s}" for s in ("_bucket", "_sum", "_count")),
}
# The SDK's own metrics the rules and dashboard query, as a worker serves them on
# its /metrics (tests/workers/test_metrics.py reads each from a real worker).
SDK_METRICS = {
    "temporal_workflow_task_execution_failed_total",
    "temporal_workflow_failed_total",  # what the UI counts under Failures (read there too)
}

# Debian's promtool (`apt-get install -y --no-install-recommends prometheus`).
promtool = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    promtool is None,
    reason="promtool not found: apt-get install -y --no-install-recommends prometheus",
)


@needs_promtool
def test_promtool_check_config() -> None:
    result = run([str(promtool), "check", "config", str(MON / "prometheus.yml")])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 rule files found" in result.stdout + result.stderr


@needs_promtool
def test_promtool_check_rules() -> None:
    rules = sorted(str(p) for p in (MON / "rules").glob("*.yml"))
    assert rules
    result = run([str(promtool), "check", "rules", *rules])
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_alerts_fire_on_synthetic_series() -> None:
    # deploy/monitoring/tests/*.yml: each alert fires where it should and nowhere else.
    tests = sorted(str(p) for p in (MON / "tests").glob("*.yml"))
    result = run([str(promtool), "test", "rules", *tests], cwd=MON / "tests")
    assert result.returncode == 0, result.stdout + result.stderr


def _exported_metric_names() -> set[str]:
    registry = CollectorRegistry()
    WorkerMetrics(registry)
    out = set()
    for family in registry.collect():
        suffixes = {
            "counter": ("_total",),
            "histogram": ("_bucket", "_sum", "_count"),
        }.get(family.type, ("",))
        out.update(family.name + s for s in suffixes)
    return out


def _queried_metrics(expr: str) -> set[str]:
    return set(re.findall(r"\b((?:aiworker|temporal)_[a-z_]+)\b", expr))


def _rule_exprs() -> list[str]:
    exprs = []
    for path in (MON / "rules").glob("*.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            exprs += [r["expr"] for r in group["rules"]]
    return exprs


def _dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((MON / "grafana/dashboards/aiworker.json").read_text())
    return doc


def test_rules_and_dashboard_query_only_exported_metrics() -> None:
    known = _exported_metric_names() | ORCHESTRATION_METRICS | SDK_METER_METRICS | SDK_METRICS
    exprs = _rule_exprs() + [
        t["expr"] for p in _dashboard()["panels"] for t in p.get("targets", [])
    ]
    queried = set().union(*(_queried_metrics(e) for e in exprs))
    assert queried, "no aiworker metric is queried"
    assert queried <= known, sorted(queried - known)


def test_alert_rules_cover_the_issue() -> None:
    alerts = {
        r["alert"]
        for path in (MON / "rules").glob("*.yml")
        for g in yaml.safe_load(path.read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    assert {
        "AiworkerHighErrorRate",
        "AiworkerLatencyOverSLO",
        "AiworkerRetryStorm",
        "AiworkerReviewOverdue",
        "AiworkerBreakerOpen",
        "AiworkerWorkflowTaskFailing",
    } <= alerts


def test_dashboard_shows_what_operators_ask() -> None:
    dash = _dashboard()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p.get("targets", []))
    for needle in (
        'status="failed"',
        "histogram_quantile(0.5,",
        "histogram_quantile(0.95,",
        "histogram_quantile(0.99,",
        "aiworker_retries_total",
        "aiworker_tokens_total",
        "aiworker_cost_usd_total",
        "aiworker_pipelines_total",
        "error_code, tenant",
        "temporal_workflow_task_execution_failed_total",
    ):
        assert needle in exprs, needle
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]


def test_grafana_provisioning_matches_the_compose_mounts() -> None:
    prov = yaml.safe_load((MON / "grafana/provisioning/dashboards/aiworker.yml").read_text())
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    path = prov["providers"][0]["options"]["path"]
    assert f"./deploy/monitoring/grafana/dashboards:{path}:ro" in mounts
    ds = yaml.safe_load((MON / "grafana/provisioning/datasources/prometheus.yml").read_text())
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"
    dash_var = next(v for v in _dashboard()["templating"]["list"] if v["name"] == "datasource")
    assert dash_var["current"]["value"] == ds["datasources"][0]["uid"]

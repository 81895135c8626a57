"""docker-compose.yml: `docker compose config` accepts it, and it runs the stack of the README."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from deploy_tools import ROOT, compose_binary, run
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.workers.process.telemetry import (
    log_exporter_from_env,
    metric_exporter_from_env,
    span_exporter_from_env,
)

WORKER_SERVICES = {
    "aiworker-pipelines": names.PIPELINES_QUEUE,
    "aiworker-scrape": names.SCRAPE_QUEUE,
    "aiworker-llm": names.LLM_QUEUE,
}


# what an operator puts in .env (docs/registry.md); compose refuses to start without it
SECRET = "a-registry-secret-from-dotenv"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """The fully resolved model, as `docker compose config` prints it."""
    # No Docker engine is needed: `config` only parses, merges and validates.
    result = run(
        [
            str(compose_binary()),
            "-f",
            str(ROOT / "docker-compose.yml"),
            "config",
            "--format",
            "json",
        ],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": str(ROOT), "AIWORKER_REGISTRY_SECRET": SECRET},
    )
    assert result.returncode == 0, result.stderr
    import json

    model: dict[str, Any] = json.loads(result.stdout)
    return model


def test_compose_config_rejects_a_broken_file(tmp_path: Any) -> None:
    # Guards the check itself: the binary's exit code must mean something.
    bad = tmp_path / "docker-compose.yml"
    bad.write_text(
        "services:\n  x:\n    image: busybox:1.36\n"
        "    depends_on:\n      y:\n        condition: service_healthy\n"
    )
    result = run([str(compose_binary()), "-f", str(bad), "config", "-q"], cwd=tmp_path)
    assert result.returncode != 0
    assert "y" in result.stderr


def test_services_of_the_stack(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in (
        "postgresql",
        "temporal",
        "temporal-setup",
        "temporal-ui",
        "prometheus",
        "grafana",
        "jaeger",
        "aiworker-serve",
        *WORKER_SERVICES,
    ):
        assert name in services, name


def test_images_are_pinned(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        image = svc["image"]
        tag = image.rsplit(":", 1)[1] if ":" in image.split("/")[-1] else ""
        assert tag and tag != "latest", f"{name}: image {image!r} is not pinned"
        assert re.search(r"\d", tag), f"{name}: tag {tag!r} names no version"


def test_one_worker_service_per_task_queue(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, queue in WORKER_SERVICES.items():
        svc = services[name]
        assert svc["build"]["dockerfile"] == "deploy/Dockerfile"
        env = svc["environment"]
        assert env["AIWORKER_TASK_QUEUES"] == queue
        assert env["TEMPORAL_ADDRESS"] == "temporal:7233"
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"].startswith("http://jaeger:4318")
        # The exporters these variables ask for are ones the image has: spans to
        # Jaeger over http/protobuf; Jaeger takes no metrics or logs.
        otel = {k: v for k, v in env.items() if k.startswith("OTEL_") and v is not None}
        assert isinstance(span_exporter_from_env(otel), OTLPSpanExporter)
        assert metric_exporter_from_env(otel) is None
        assert log_exporter_from_env(otel) is None
        # The process would refuse an unknown or malformed AIWORKER_* variable.
        settings = Settings.from_env({k: v for k, v in env.items() if v is not None})
        assert settings.task_queues == (queue,)
        assert settings.registry_secret is not None
        assert settings.registry_secret.get_secret_value() == SECRET
        assert not settings.allow_private_networks
        grace = _seconds(svc["stop_grace_period"])
        assert grace > settings.shutdown_grace_seconds
        assert "9464/healthz" in " ".join(svc["healthcheck"]["test"])
        deps = svc["depends_on"]
        assert deps["temporal"]["condition"] == "service_healthy"
        assert deps["temporal-setup"]["condition"] == "service_completed_successfully"


def test_the_front_door_serves_with_its_keys_and_hooks(compose: dict[str, Any]) -> None:
    svc = compose["services"]["aiworker-serve"]
    assert svc["entrypoint"] == ["aiworker", "serve"]
    env = svc["environment"]
    settings = Settings.from_env({k: v for k, v in env.items() if k.startswith("AIWORKER_")})
    assert settings.serve_port == 8000
    assert settings.registry_secret is not None
    assert {(p["target"], p["published"]) for p in svc["ports"]} == {(8000, "8000")}
    assert "8000/healthz" in " ".join(svc["healthcheck"]["test"])
    assert svc["depends_on"]["temporal"]["condition"] == "service_healthy"
    (mount,) = [v for v in svc["volumes"] if v["type"] == "bind"]
    assert mount["read_only"] is True
    # The files the settings name are the mounted ones, and a door would start with them.
    from aiworker.workers.frontdoor.auth import KeyRing, load_hooks

    for path in (settings.api_keys_file, settings.hooks_file):
        assert path is not None and str(path).startswith(mount["target"] + "/")
        local = ROOT / mount["source"] / path.name
        assert local.exists(), local
    KeyRing.load(ROOT / mount["source"] / "keys.json")
    load_hooks(ROOT / mount["source"] / "hooks.json", {})


def test_startup_order_and_health_checks(compose: dict[str, Any]) -> None:
    s = compose["services"]
    assert s["temporal"]["depends_on"]["postgresql"]["condition"] == "service_healthy"
    assert s["temporal-setup"]["depends_on"]["temporal"]["condition"] == "service_healthy"
    assert s["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"
    for name in ("postgresql", "temporal", "prometheus", "grafana", "temporal-ui"):
        assert s[name].get("healthcheck", {}).get("test"), f"{name} has no health check"


# What each image of the stack ships that a health check may call, and where that is
# said. A health check whose binary an image lacks fails forever and holds back every
# service that waits for it (service_healthy), so each check's binary must be here.
IMAGE_TOOLS: dict[str, tuple[set[str], str]] = {
    "aiworker": (
        {"python"},
        "deploy/Dockerfile: python:3.11-slim-bookworm runtime, nothing added (no curl, no wget)",
    ),
    "postgres": (
        {"pg_isready", "sh"},
        "docker-library/postgres Alpine Dockerfile: the PostgreSQL client tools, BusyBox sh",
    ),
    "temporalio/auto-setup": (
        {"temporal", "tctl", "curl", "bash", "sh"},
        "temporalio/docker-builds server.Dockerfile (auto-setup target): copies the temporal "
        "CLI and tctl onto temporalio/base-server (Alpine + bash, curl); its auto-setup.sh "
        "itself waits with `temporal operator cluster health`",
    ),
    "temporalio/ui": (
        {"curl", "bash", "sh"},
        "temporalio/ui server/Dockerfile: the ui-server binary on temporalio/base-server "
        "(Alpine + bash, curl; later releases on alpine with curl too)",
    ),
    "prom/prometheus": (
        {"wget", "sh"},
        "prometheus/prometheus Dockerfile: FROM quay.io/prometheus/busybox (BusyBox applets, "
        "wget among them; no curl)",
    ),
    "grafana/grafana": (
        {"curl", "bash", "sh"},
        "grafana/grafana Dockerfile: apk add ca-certificates bash curl tzdata musl-utils "
        "(Alpine; the Ubuntu variant installs curl too)",
    ),
}


def _repository(image: str) -> str:
    name = image.rsplit(":", 1)[0] if ":" in image.split("/")[-1] else image
    return name.removeprefix("docker.io/").removeprefix("library/")


def _check_binary(test: list[str]) -> str:
    kind, *rest = test
    if kind == "CMD":
        return rest[0]
    assert kind == "CMD-SHELL", test
    return rest[0].split()[0]


def test_health_checks_call_only_what_their_image_ships(compose: dict[str, Any]) -> None:
    checked = set()
    for name, svc in compose["services"].items():
        test = svc.get("healthcheck", {}).get("test")
        if not test or svc.get("healthcheck", {}).get("disable"):
            continue
        repo = _repository(svc["image"])
        assert repo in IMAGE_TOOLS, f"{name}: say what {repo} ships in IMAGE_TOOLS"
        tools, _source = IMAGE_TOOLS[repo]
        binary = _check_binary(test)
        assert binary in tools, f"{name}: {binary!r} is not known to be in {repo} ({tools})"
        if test[0] == "CMD-SHELL":
            assert "sh" in tools, f"{name}: CMD-SHELL needs a shell in {repo}"
        checked.add(name)
    assert {"temporal-ui", "grafana", "prometheus", "postgresql", "temporal"} <= checked
    # The guard bites: the check this replaced (wget in the UI image) is refused.
    assert "wget" not in IMAGE_TOOLS["temporalio/ui"][0]
    assert "curl" not in IMAGE_TOOLS["prom/prometheus"][0]


def test_search_attributes_are_registered_by_the_one_shot_setup() -> None:
    script = (ROOT / "deploy/temporal/setup-search-attributes.sh").read_text()
    for attr in names.SEARCH_ATTRIBUTES:
        assert attr in script
    assert "search-attribute create" in script and "--type Keyword" in script


def test_bind_mounts_exist_in_the_repository(compose: dict[str, Any]) -> None:
    # `config` does not check that a bind-mount source exists; Docker would
    # silently create an empty directory instead.
    for name, svc in compose["services"].items():
        for vol in svc.get("volumes", []):
            if vol["type"] == "bind":
                assert (ROOT / vol["source"]).exists(), f"{name}: {vol['source']} is missing"


def test_prometheus_scrapes_every_worker_service() -> None:
    cfg = yaml.safe_load((ROOT / "deploy/monitoring/prometheus.yml").read_text())
    targets = {
        t
        for job in cfg["scrape_configs"]
        for sc in job.get("static_configs", [])
        for t in sc["targets"]
    }
    for name in WORKER_SERVICES:
        assert f"{name}:9464" in targets


def _seconds(value: Any) -> float:
    """A Go duration as compose prints it ('1m15s')."""
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?", str(value))
    assert m and value, value
    h, mi, s = (float(g or 0) for g in m.groups())
    return h * 3600 + mi * 60 + s

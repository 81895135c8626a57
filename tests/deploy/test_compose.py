"""docker-compose.yml: `docker compose config` accepts it, and it runs the stack of the README."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from deploy_tools import ROOT, compose_binary, run

from aiworker.config.settings import Settings
from aiworker.schemas import names

WORKER_SERVICES = {
    "aiworker-pipelines": names.PIPELINES_QUEUE,
    "aiworker-scrape": names.SCRAPE_QUEUE,
    "aiworker-llm": names.LLM_QUEUE,
}


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
        env={"PATH": "/usr/bin:/bin", "HOME": str(ROOT)},
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
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"].startswith("http://jaeger:4317")
        # The process would refuse an unknown or malformed AIWORKER_* variable.
        settings = Settings.from_env({k: v for k, v in env.items() if v is not None})
        assert settings.task_queues == (queue,)
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

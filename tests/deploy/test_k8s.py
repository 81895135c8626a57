"""deploy/k8s: both overlays render with kustomize and pass kubernetes-validate --strict.

So does the overlay that deploy/README.md shows for your own workers (a
plugin image, the ``worker-specs`` component mounting spec files from a
ConfigMap, the plugin's queue): its YAML block is built, as written, in a copy
of ``deploy/k8s``, and what it mounts is loaded as a worker process would.

kubernetes-validate ships schemas for the built-in kinds only. The
ServiceMonitor (a prometheus-operator CRD) and the KEDA ScaledObjects (the
``keda-backlog`` component), both in optional components that the prod
overlay includes, are split off before validation and checked here by shape
instead, so nothing is skipped silently: the strict run must report no kind
without a schema, and every CRD object split off is one a shape test reads.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_tools import DEPLOY, KUBERNETES_VERSION, run, tool

from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.options import activity_options
from aiworker.workers.process.worker_set import load_workers

OVERLAYS = ("dev", "prod")
QUEUES = {
    "aiworker-pipelines": names.PIPELINES_QUEUE,
    "aiworker-scrape": names.SCRAPE_QUEUE,
    "aiworker-llm": names.LLM_QUEUE,
}
# The longest activity timeout any worker may declare (web-scrape and llm-call
# specs stay within it); the pods' drain must outlast it.
LONGEST_ACTIVITY_TIMEOUT_SECONDS = 60
PRIVATE_V4 = {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "127.0.0.0/8"}
CRD_GROUPS = ("monitoring.coreos.com/", "keda.sh/")
# The CRD kinds the shape tests below read; any other CRD object fails the strict test.
CRD_KINDS = {"ServiceMonitor", "ScaledObject"}
# The overlay deploy/README.md shows in "Your own workers", built as overlays/<this>.
DOCUMENTED = "acme"
SPECS_DIR = "/etc/aiworker/workers"
PLUGIN_IMAGE = "ghcr.io/acme/aiworker-pii:1.0.0"
# The HTTP front door's Deployment (no task queue: it only talks to Temporal).
SERVE = "aiworker-serve"


@functools.cache
def _render_text(overlay: str) -> str:
    result = run([tool("kubectl"), "kustomize", str(DEPLOY / "k8s" / "overlays" / overlay)])
    assert result.returncode == 0, result.stderr
    return result.stdout


def render(overlay: str) -> list[dict[str, Any]]:
    """The overlay's objects (a fresh copy each call; kustomize runs once)."""
    return [d for d in yaml.safe_load_all(_render_text(overlay)) if d]


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(request.param)


def prompt_spec(worker_id: str) -> dict[str, Any]:
    """A prompt worker's spec file, on the queue of the llm pods."""
    return {
        "worker_id": worker_id,
        "version": "1.0.0",
        "purpose": "Sort a support ticket into a queue, with a model and no code.",
        "task_queue": names.LLM_QUEUE,
        "input_schema": {
            "type": "object",
            "required": ["subject", "body"],
            "properties": {"subject": {"type": "string"}, "body": {"type": "string"}},
        },
        "output_schema": {
            "type": "object",
            "required": ["queue"],
            "properties": {"queue": {"enum": ["billing", "login", "bug", "other"]}},
        },
        "constraints": {"timeout_seconds": 45, "tools_allowed": ["language_model"]},
        "retries": {"max_attempts": 3},
        "implementation": {
            "kind": "prompt",
            "prompt": "Subject: ${{ input.subject }}\n\n${{ input.body }}\n\nWhich queue?",
        },
    }


@pytest.fixture(scope="module")
def documented(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The README's overlay for your own workers, rendered in a copy of deploy/k8s."""
    blocks = re.findall(r"```yaml\n(.*?)```", (DEPLOY / "README.md").read_text(), re.S)
    (block,) = [b for b in blocks if "components/worker-specs" in b]
    k8s = tmp_path_factory.mktemp("documented") / "k8s"
    shutil.copytree(DEPLOY / "k8s", k8s)
    overlay = k8s / "overlays" / DOCUMENTED
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(block)
    (generator,) = [
        g
        for g in yaml.safe_load(block)["configMapGenerator"]
        if g["name"] == "aiworker-worker-specs"
    ]
    for name in generator["files"]:
        path = overlay / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(prompt_spec(path.stem)))
    result = run([tool("kubectl"), "kustomize", str(overlay)])
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


@pytest.fixture(scope="module")
def validation(
    tmp_path_factory: pytest.TempPathFactory, documented: list[dict[str, Any]]
) -> tuple[int, str]:
    """One kubernetes-validate --strict run over the overlays' built-in kinds."""
    out_dir = tmp_path_factory.mktemp("k8s")
    paths = []
    for overlay in (*OVERLAYS, DOCUMENTED):
        docs = documented if overlay == DOCUMENTED else render(overlay)
        standard = [d for d in docs if not d["apiVersion"].startswith(CRD_GROUPS)]
        path = out_dir / f"{overlay}.yaml"
        path.write_text(yaml.safe_dump_all(standard, sort_keys=False))
        paths.append(str(path))
    result = run(
        [tool("kubernetes-validate"), "--strict", "-k", KUBERNETES_VERSION, *paths], timeout=120
    )
    return result.returncode, result.stdout + result.stderr


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def test_overlays_pass_strict_validation(
    validation: tuple[int, str], documented: list[dict[str, Any]]
) -> None:
    code, out = validation
    assert code == 0, out
    assert "Couldn't find schema" not in out, out
    for overlay in (*OVERLAYS, DOCUMENTED):
        docs = documented if overlay == DOCUMENTED else render(overlay)
        kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
        passed = out.count(f"{overlay}.yaml passed for resource")
        crds = [d for d in docs if d["apiVersion"].startswith(CRD_GROUPS)]
        assert passed == len(kinds) - len(crds), out
        assert {d["kind"] for d in crds} <= CRD_KINDS, crds


def test_strict_validation_rejects_an_unknown_field() -> None:
    # Guards the check: strict mode must fail a misspelt field, not accept it.
    # (The library call, not a third CLI start: each costs seconds here.)
    import kubernetes_validate

    deploy = of_kind(render("dev"), "Deployment")["aiworker-scrape"]
    kubernetes_validate.validate(deploy, KUBERNETES_VERSION, strict=True)
    deploy["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deploy, KUBERNETES_VERSION, strict=True)


def test_one_deployment_per_task_queue(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    deployments = of_kind(docs, "Deployment")
    assert set(deployments) == {*QUEUES, SERVE}
    settings_env = _configmap_env(docs)
    for name, queue in QUEUES.items():
        pod = deployments[name]["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["AIWORKER_TASK_QUEUES"] == queue
        # The worker would refuse an unknown or malformed AIWORKER_* variable.
        plain = {k: v for k, v in {**settings_env, **env}.items() if v is not None}
        settings = Settings.from_env(plain)
        assert settings.task_queues == (queue,)
        assert settings.metrics_port == 9464
        assert not settings.allow_private_networks
        assert c["resources"]["requests"] and c["resources"]["limits"]
        probes = {p: c[p]["httpGet"] for p in ("livenessProbe", "readinessProbe")}
        assert probes["livenessProbe"]["path"] == "/healthz"
        assert probes["readinessProbe"]["path"] == "/readyz"
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert all(ports[p["port"]] == 9464 for p in probes.values())


def test_drain_outlasts_the_longest_activity(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    settings = Settings.from_env(_configmap_env(docs))
    longest = LONGEST_ACTIVITY_TIMEOUT_SECONDS
    for spec in load_specs().values():
        if spec.implementation.kind == "workflow":
            continue  # llm-agent: a child workflow, no activity of its own to drain
        assert spec.constraints.timeout_seconds <= longest, spec.worker_id
        timeout = activity_options(spec)["start_to_close_timeout"].total_seconds()
        assert settings.shutdown_grace_seconds >= timeout, spec.worker_id
    # Temporal's start-to-close timeout adds 5 s past the worker's own deadline.
    assert settings.shutdown_grace_seconds >= longest + 5
    for name in QUEUES:
        d = of_kind(docs, "Deployment")[name]
        grace = d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace > settings.shutdown_grace_seconds, name


def test_pods_run_non_root_with_a_read_only_root(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = rendered
    for name, d in of_kind(docs, "Deployment").items():
        pod = d["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["automountServiceAccountToken"] is False
        (c,) = pod["containers"]
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True, name
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        for path in ("/tmp", "/data"):
            assert "emptyDir" in volumes[mounts[path]], f"{name}: {path}"
        assert _configmap_env(docs)["AIWORKER_DATA_DIR"] == "/data"


def test_each_deployment_has_one_autoscaler_and_a_pdb(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = rendered
    deployments = of_kind(docs, "Deployment")
    hpas = of_kind(docs, "HorizontalPodAutoscaler")
    scaled = of_kind(docs, "ScaledObject")
    pdbs = of_kind(docs, "PodDisruptionBudget")
    target = {"apiVersion": "apps/v1", "kind": "Deployment"}
    for name, d in deployments.items():
        # Exactly one autoscaler per Deployment: KEDA owns an HPA of its own, and two
        # HPAs on one Deployment would fight.
        assert (name in hpas) != (name in scaled), name
        if name in hpas:
            hpa = hpas[name]["spec"]
            assert hpa["scaleTargetRef"] == {**target, "name": name}
            assert 1 <= hpa["minReplicas"] <= hpa["maxReplicas"]
        else:
            so = scaled[name]["spec"]
            assert so["scaleTargetRef"] == {**target, "name": name}
            assert 1 <= so["minReplicaCount"] <= so["maxReplicaCount"]
        pod_labels = d["spec"]["template"]["metadata"]["labels"]
        selector = pdbs[name]["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pod_labels.items()
        assert d["spec"]["selector"]["matchLabels"] == selector
    assert not set(hpas) - set(deployments), hpas
    assert not set(scaled) - set(deployments), scaled


# What each queue's pods poll: the pipelines pods run workflow tasks and the
# light activities, the others activities only.
QUEUE_TYPES = {"aiworker-pipelines": {"workflow", "activity"}}
TEMPORAL_TRIGGER_KEYS = {
    "endpoint",
    "namespace",
    "taskQueue",
    "queueTypes",
    "targetQueueSize",
    "activationTargetQueueSize",
    "workerDeploymentName",
    "workerDeploymentBuildId",
}


def test_prod_scales_worker_pods_on_task_queue_backlog() -> None:
    """KEDA's ``temporal`` scaler on each worker Deployment's own queue, in the
    namespace and on the frontend the pods use, counting the build they run."""
    from aiworker.workers.process.deployments import deployment_name

    docs = render("prod")
    settings = Settings.from_env(_configmap_env(docs))
    scaled = of_kind(docs, "ScaledObject")
    assert set(scaled) == set(QUEUES), scaled
    assert not set(QUEUES) & set(of_kind(docs, "HorizontalPodAutoscaler"))
    deployments = of_kind(docs, "Deployment")
    for name, so in scaled.items():
        assert so["apiVersion"] == "keda.sh/v1alpha1"
        spec = so["spec"]
        assert spec["scaleTargetRef"]["name"] == name
        assert spec["minReplicaCount"] >= 2, name  # a PDB lets one pod go at a time
        assert spec["minReplicaCount"] <= spec["maxReplicaCount"]
        down = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
        assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 120}]
        (trigger,) = spec["triggers"]
        assert trigger["type"] == "temporal"
        meta = trigger["metadata"]
        assert set(meta) <= TEMPORAL_TRIGGER_KEYS, set(meta) - TEMPORAL_TRIGGER_KEYS
        # KEDA reads trigger metadata as strings only
        assert all(isinstance(v, str) for v in meta.values()), meta
        (c,) = deployments[name]["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        pod = Settings.from_env(
            {k: v for k, v in {**_configmap_env(docs), **env}.items() if v is not None}
        )
        assert meta["taskQueue"] == pod.queue(QUEUES[name])
        assert meta["endpoint"] == _configmap_env(docs)["TEMPORAL_ADDRESS"]
        assert meta["namespace"] == _configmap_env(docs)["TEMPORAL_NAMESPACE"]
        assert set(meta["queueTypes"].split(",")) == QUEUE_TYPES.get(name, {"activity"})
        assert int(meta["targetQueueSize"]) >= 1
        assert int(meta["activationTargetQueueSize"]) >= 0
        # versioned pods: the backlog of this build, under the deployment's real name
        assert meta["workerDeploymentName"] == deployment_name(settings)
        assert settings.build_id and meta["workerDeploymentBuildId"] == settings.build_id
    # dev (kind, minikube: no KEDA) keeps the CPU HPAs
    assert not of_kind(render("dev"), "ScaledObject")


def test_network_policy_limits_egress(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    policies = list(of_kind(docs, "NetworkPolicy").values())
    deployments = of_kind(docs, "Deployment")

    def egress_for(deployment: str) -> list[dict[str, Any]]:
        labels = deployments[deployment]["spec"]["template"]["metadata"]["labels"]
        rules = []
        for p in policies:
            if p["spec"]["podSelector"]["matchLabels"].items() <= labels.items():
                # An ingress-only policy (the front door's) says nothing about egress.
                if p["spec"]["policyTypes"] == ["Ingress"]:
                    assert "egress" not in p["spec"]
                    continue
                assert "Egress" in p["spec"]["policyTypes"]
                rules += p["spec"].get("egress", [])
        return rules

    for name in deployments:
        rules = egress_for(name)
        ports = [(p.get("protocol"), p["port"]) for r in rules for p in r.get("ports", [])]
        assert ("UDP", 53) in ports, f"{name}: no DNS"
        assert ("TCP", 7233) in ports, f"{name}: no Temporal"
        for r in rules:
            assert r.get("to"), f"{name}: an egress rule without a destination allows everything"
            assert r.get("ports"), f"{name}: an egress rule without ports allows every port"
            for peer in r["to"]:
                block = peer.get("ipBlock")
                if block and block["cidr"] == "0.0.0.0/0":
                    assert PRIVATE_V4 <= set(block["except"]), f"{name}: private ranges open"
    public = {
        n: {
            p["port"]
            for r in egress_for(n)
            for peer in r["to"]
            if "ipBlock" in peer
            for p in r["ports"]
        }
        for n in deployments
    }
    assert public["aiworker-scrape"] == {80, 443}
    assert public["aiworker-llm"] == {443}


def test_settings_come_from_a_configmap_and_keys_from_secrets(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    overlay, docs = rendered
    (cm_name,) = [n for n in of_kind(docs, "ConfigMap") if n.startswith("aiworker-settings")]
    for name, d in of_kind(docs, "Deployment").items():
        (c,) = d["spec"]["template"]["spec"]["containers"]
        assert {"configMapRef": {"name": cm_name}} in c["envFrom"]
        for e in c["env"]:
            if "KEY" in e["name"] and not e["name"].endswith("_FILE"):  # a file's path
                assert "secretKeyRef" in e["valueFrom"], f"{name}: {e['name']} is not a Secret"
    assert not of_kind(docs, "Secret"), "secrets are referenced, never rendered from git"
    llm = of_kind(docs, "Deployment")["aiworker-llm"]["spec"]["template"]["spec"]
    key = next(e for e in llm["containers"][0]["env"] if e["name"] == "AIWORKER_LLM_API_KEY")
    # prod does not start without the key; dev may run without one.
    assert key["valueFrom"]["secretKeyRef"]["optional"] is (overlay == "dev")


def test_the_front_door_runs_with_probes_limits_and_its_keys(
    rendered: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    from aiworker.workers.frontdoor.auth import KeyRing, load_hooks

    _, docs = rendered
    pod = of_kind(docs, "Deployment")[SERVE]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["aiworker", "serve"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    plain = {k: v for k, v in {**_configmap_env(docs), **env}.items() if v is not None}
    settings = Settings.from_env(plain)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": settings.serve_port}
    probes = {p: c[p]["httpGet"] for p in ("livenessProbe", "readinessProbe")}
    assert probes["livenessProbe"] == {"path": "/healthz", "port": "http"}
    assert probes["readinessProbe"] == {"path": "/readyz", "port": "http"}
    assert c["resources"]["requests"] and c["resources"]["limits"]
    # Keys and hooks: a ConfigMap mounted read-only where the settings point;
    # hook secrets come from a Secret that is referenced, never rendered.
    mount = next(m for m in c["volumeMounts"] if m["name"] == "serve-config")
    assert mount["readOnly"] is True
    volume = next(v for v in pod["volumes"] if v["name"] == "serve-config")
    files = of_kind(docs, "ConfigMap")[volume["configMap"]["name"]]["data"]
    for path in (settings.api_keys_file, settings.hooks_file):
        assert path is not None and path.parent == Path(mount["mountPath"]) and path.name in files
        (tmp_path / path.name).write_text(files[path.name])
    KeyRing.load(tmp_path / "keys.json")
    load_hooks(tmp_path / "hooks.json", {})
    assert {"secretRef": {"name": "aiworker-serve-hooks", "optional": True}} in c["envFrom"]
    # Reachable through its Service on the http port, and the network lets it in.
    service = of_kind(docs, "Service")[SERVE]
    assert service["spec"]["selector"].items() <= pod_labels(docs, SERVE).items()
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    ingress = of_kind(docs, "NetworkPolicy")["aiworker-serve-ingress"]["spec"]["ingress"]
    assert {"protocol": "TCP", "port": settings.serve_port} in ingress[0]["ports"]


def pod_labels(docs: list[dict[str, Any]], deployment: str) -> dict[str, str]:
    labels: dict[str, str] = of_kind(docs, "Deployment")[deployment]["spec"]["template"][
        "metadata"
    ]["labels"]
    return labels


def test_service_monitor_selects_the_metrics_service() -> None:
    docs = render("prod")
    (sm,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    services = [
        s
        for s in of_kind(docs, "Service").values()
        if sm["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    ]
    assert len(services) == 1
    port_names = {p["name"] for p in services[0]["spec"]["ports"]}
    for ep in sm["spec"]["endpoints"]:
        assert ep["port"] in port_names
        assert ep["path"] == "/metrics"
    # The Service selects every worker pod.
    for d in of_kind(docs, "Deployment").values():
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert services[0]["spec"]["selector"].items() <= labels.items()
    assert not [d for d in render("dev") if d["kind"] == "ServiceMonitor"]


def test_worker_specs_component_mounts_the_same_specs_in_every_pod(
    documented: list[dict[str, Any]], tmp_path: Path
) -> None:
    maps = of_kind(documented, "ConfigMap")
    (specs_cm,) = [n for n in maps if n.startswith("aiworker-worker-specs-")]  # hashed: rolls
    (settings_cm,) = [n for n in maps if n.startswith("aiworker-settings-")]
    assert maps[settings_cm]["data"]["AIWORKER_WORKER_SPECS"] == SPECS_DIR
    deployments = of_kind(documented, "Deployment")
    assert set(deployments) == {*QUEUES, SERVE}
    del deployments[SERVE]  # mounts no worker specs: it runs no worker
    polled: set[str] = set()
    for name, d in deployments.items():
        pod = d["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        assert c["image"] == PLUGIN_IMAGE, name
        volume = next(v for v in pod["volumes"] if v["name"] == "worker-specs")
        assert volume["configMap"]["name"] == specs_cm, f"{name}: mounts {volume}"
        mount = next(m for m in c["volumeMounts"] if m["name"] == "worker-specs")
        assert (mount["mountPath"], mount["readOnly"]) == (SPECS_DIR, True)
        env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
        settings = Settings.from_env({**maps[settings_cm]["data"], **env})
        assert settings.worker_specs == (Path(SPECS_DIR),)
        polled.update(settings.task_queues)
    assert polled == {*QUEUES.values(), "acme-text"}

    # What a pod finds in the mounted directory, loaded as its worker process does.
    folder = tmp_path / "workers"
    folder.mkdir()
    for key, text in maps[specs_cm]["data"].items():
        (folder / key).write_text(text)
    workers = load_workers(Settings(worker_specs=(folder,)))
    mounted = [e for e in workers.catalog.entries.values() if e.origin.startswith("file ")]
    assert [e.worker_id for e in mounted] == ["classify-ticket"]
    for e in mounted:
        assert e.spec.kind == "prompt"
        assert e.spec.task_queue in polled, f"no Deployment polls {e.spec.task_queue}"
        assert e.worker_id in workers.served
    # The component is optional: the overlays themselves mount no specs.
    for overlay in OVERLAYS:
        for d in of_kind(render(overlay), "Deployment").values():
            assert "worker-specs" not in {
                v["name"] for v in d["spec"]["template"]["spec"]["volumes"]
            }


def _configmap_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    (cm,) = [c for n, c in of_kind(docs, "ConfigMap").items() if n.startswith("aiworker-settings")]
    return dict(cm["data"])


def test_every_aiworker_process_gets_the_registry_secret_from_a_secret(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    # the live registry's entries are signed with it: a process without it uses no
    # published spec, so every Deployment has it; prod does not start without it
    overlay, docs = rendered
    for name, d in of_kind(docs, "Deployment").items():
        (c,) = d["spec"]["template"]["spec"]["containers"]
        (e,) = [e for e in c["env"] if e["name"] == "AIWORKER_REGISTRY_SECRET"]
        ref = e["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == ("aiworker-registry", "secret"), name
        assert ref["optional"] is (overlay == "dev"), name

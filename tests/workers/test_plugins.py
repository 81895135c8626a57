"""Plugins: workers from installed packages and modules, loaded once at process start.

The "Done when" of issue 13: the example plugin (``examples/plugin``, a
separate folder with its own ``pyproject.toml``, whose root also holds a
Temporal project's ``activities.py`` and ``workflows.py``) is installed with
``pip install`` into a virtualenv of its own, a real ``aiworker worker``
process from that environment serves it, and a pipeline started with the
``temporal`` CLI runs it. Nothing of aiworker is changed or configured for it.

Why a new virtualenv rather than the project's: the test must not install
into the environment it runs from. The new one is made with ``venv
--without-pip`` and a ``.pth`` file that adds the project's site-packages
(``site.addsitedir``, so its own ``.pth`` files run too): the plugin installs
into the new environment with the project's pip and setuptools, offline
(``--no-deps --no-build-isolation``), and finds aiworker and its dependencies
where they are installed, as ``pip install`` into the project's venv would.
(``venv --system-site-packages`` would not do: from a venv's python it
exposes the base interpreter's site-packages, not the project's.) aiworker
itself is the copy this test imported: a directory holding only a link named
``aiworker`` comes first, so the repository root, whose ``activities/`` and
``workflows/`` folders would shadow the plugin's modules, is never on the path.

Broken plugins stop the process at start, naming the plugin, the file and the
field, with nothing registered: checked on :func:`load_workers` with entry
points of crafted distributions, and once through a real ``aiworker worker``.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import shutil
import site
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import installed_workers, running_stack
from support import history
from support.procs import WorkerProcess, worker_env
from support.waiting import wait_until
from temporalio.api.enums.v1 import EventType, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

import aiworker
from aiworker.config import catalog
from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.workers.devstack.devserver import temporal_cli_path
from aiworker.workers.errors import StartupError
from aiworker.workers.process.worker import load_process_workers
from aiworker.workers.process.worker_set import ENTRY_POINT_GROUP, PluginError, load_workers

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_SRC = ROOT / "examples" / "plugin"
PLUGIN_DIST = "acme-pii"
PLUGIN_QUEUE = "acme-text"
AIWORKER = str(Path(sys.executable).parent / "aiworker")

TICKET = "Customer jane.doe@example.com (+1 415 555 0100) cannot log in since Monday."
REDACTED = "Customer [redacted] ([redacted]) cannot log in since Monday."


def redact_pipeline(name: str) -> dict[str, Any]:
    """The plugin's worker, then a built-in gate on its output."""
    return {
        "name": name,
        "tenant": "acme",
        "inputs": {"ticket": TICKET},
        "steps": [
            {"id": "redact", "worker": "pii-redact", "input": {"text": "${{ inputs.ticket }}"}},
            {
                "id": "no-email-left",
                "worker": names.VALIDATOR,
                "depends_on": ["redact"],
                "input": {
                    "data": "${{ steps.redact.outputs }}",
                    "schema": {"properties": {"text": {"not": {"pattern": "@"}}}},
                },
            },
        ],
        "output": {
            "text": "${{ steps.redact.outputs.text }}",
            "found": "${{ steps.redact.outputs.found }}",
        },
    }


# --- the plugin installed in an environment of its own ---------------------------


@dataclass(frozen=True)
class PluginEnv:
    """A virtualenv with the example plugin installed by ``pip install``."""

    python: Path
    aiworker: Path
    source: Path  # the copy of examples/plugin that pip installed
    home: Path  # a neutral working directory: `python -c` puts it first on sys.path

    def env(self, base: dict[str, str]) -> dict[str, str]:
        # PYTHONPATH may name the repository root (a developer's checkout):
        # its activities/ and workflows/ folders must not shadow the plugin's.
        return {k: v for k, v in base.items() if k != "PYTHONPATH"}


def _run(cmd: list[str], env: dict[str, str], timeout: float = 120, **kw: Any) -> Any:
    return subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False, **kw
    )


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory: pytest.TempPathFactory) -> PluginEnv:
    root = tmp_path_factory.mktemp("plugin-env")
    venv = root / "venv"
    base_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], base_env)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    purelib = _run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], base_env
    ).stdout.strip()
    # The aiworker this test imported, alone in a directory of its own.
    shim = root / "aiworker-src"
    shim.mkdir()
    (shim / "aiworker").symlink_to(Path(aiworker.__file__).parent, target_is_directory=True)
    lines = [str(shim)] + [
        f"import site; site.addsitedir({d!r})" for d in site.getsitepackages() if Path(d).is_dir()
    ]
    (Path(purelib) / "aiworker-project.pth").write_text("\n".join(lines) + "\n")
    # aiworker's console script, as pip writes it for an installed distribution.
    (script,) = importlib.metadata.distribution("aiworker").entry_points.select(
        group="console_scripts", name="aiworker"
    )
    launcher = venv / "bin" / "aiworker"
    launcher.write_text(
        f"#!{python}\nimport sys\nfrom {script.module} import {script.attr}\n"
        f"sys.exit({script.attr}())\n"
    )
    launcher.chmod(0o755)

    # Offline, the build backend comes from the environment: setuptools 70.1
    # or later builds a wheel without the separate `wheel` package.
    probe = _run(
        [
            str(python),
            "-c",
            "import importlib.util as u, setuptools; "
            "print(setuptools.__version__, bool(u.find_spec('wheel')))",
        ],
        base_env,
    )
    assert probe.returncode == 0, f"setuptools is not installed in the venv: {probe.stderr}"
    version, has_wheel = probe.stdout.split()
    major, minor = (int(x) for x in version.split(".")[:2])
    assert (major, minor) >= (70, 1) or has_wheel == "True", (
        f"setuptools {version} cannot build the plugin's wheel offline; "
        "`pip install -e '.[test]'` installs setuptools>=70.1"
    )

    # A separate folder: pip builds in the source tree, which stays untouched.
    source = root / "plugin"
    shutil.copytree(PLUGIN_SRC, source, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    installed = _run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            str(source),
        ],
        base_env,
        timeout=170,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert f"Successfully installed {PLUGIN_DIST}-1.0.0" in installed.stdout, installed.stdout
    return PluginEnv(python, launcher, source, root)


def test_the_plugin_package_passes_its_own_tests(plugin_env: PluginEnv) -> None:
    # What the plugin's own CI runs: its tests against the installed package.
    result = _run(
        [str(plugin_env.python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        plugin_env.env(dict(os.environ)),
        cwd=plugin_env.source,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 passed" in result.stdout, result.stdout


def test_the_plugin_root_modules_do_not_collide_with_aiworker(plugin_env: PluginEnv) -> None:
    probe = textwrap.dedent(
        """
        import json
        import activities, workflows
        import aiworker.activities, aiworker.workflows
        import acme_pii.worker
        print(json.dumps({
            "activities": activities.__file__,
            "workflows": workflows.__file__,
            "ticket_activity": workflows.open_ticket.__module__,
            "aiworker.activities": aiworker.activities.__file__,
            "aiworker.workflows": aiworker.workflows.__file__,
            "plugin": acme_pii.worker.__file__,
        }))
        """
    )
    result = _run(
        [str(plugin_env.python), "-c", probe],
        plugin_env.env(dict(os.environ)),
        cwd=plugin_env.home,
    )
    assert result.returncode == 0, result.stderr
    files = json.loads(result.stdout)
    site_dir = Path(files["plugin"]).parents[1]
    # The team's own modules, installed at the top level by the plugin...
    assert Path(files["activities"]) == site_dir / "activities.py"
    assert Path(files["workflows"]) == site_dir / "workflows.py"
    assert files["ticket_activity"] == "activities"
    # ...and aiworker's, under aiworker.* only, from the tree this test runs.
    package = Path(aiworker.__file__).parent.resolve()
    for sub in ("activities", "workflows"):
        assert Path(files[f"aiworker.{sub}"]).resolve() == package.parent / sub / "__init__.py"


def test_aiworker_workers_lists_the_plugin_with_its_origin(
    plugin_env: PluginEnv, tmp_path: Path
) -> None:
    env = plugin_env.env({**os.environ, "AIWORKER_DATA_DIR": str(tmp_path)})
    listed = _run([str(plugin_env.aiworker), "workers"], env)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines()[1:]}
    assert set(load_specs()) < set(rows)
    row = rows["pii-redact"]
    assert row[1:4] == ["python", "1.0.0", PLUGIN_QUEUE]
    assert row[-2:] == ["plugin", f"{PLUGIN_DIST}:pii-redact"]
    assert rows[names.VALIDATOR][-1] == "builtin"
    as_json = _run([str(plugin_env.aiworker), "workers", "--json"], env)
    spec = json.loads(as_json.stdout)["pii-redact"]
    assert spec["origin"] == f"plugin {PLUGIN_DIST}:pii-redact"
    assert spec["examples"][0]["input"]["text"].startswith("Write to")


async def _polls(client: Client, queue: str, kind: TaskQueueType.ValueType, pid: int) -> bool:
    resp = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace, task_queue=TaskQueue(name=queue), task_queue_type=kind
        )
    )
    return any(p.identity.startswith(f"{pid}@") for p in resp.pollers)


@pytest.mark.slow
@pytest.mark.timeout(170)
async def test_installed_plugin_runs_in_a_pipeline_started_by_the_temporal_cli(
    plugin_env: PluginEnv, client: Client, settings: Settings, tmp_path: Path
) -> None:
    host = client.service_client.config.target_host
    env = plugin_env.env(worker_env(client, settings, tmp_path / "data"))
    pipeline_file = tmp_path / "redact.json"
    pipeline_file.write_text(json.dumps(redact_pipeline("redact-ticket")))
    pipelines_queue = settings.queue(names.PIPELINES_QUEUE)
    temporal = [temporal_cli_path()]
    conn = ["--address", host, "--namespace", client.namespace]

    worker = WorkerProcess([str(plugin_env.aiworker), "worker"], env, tmp_path / "worker.log")
    try:
        # It serves the plugin on the queue the plugin's spec names, beside the built-ins.
        for queue, kind in (
            (pipelines_queue, TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW),
            (settings.queue(PLUGIN_QUEUE), TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY),
        ):

            async def polled(queue: str = queue, kind: Any = kind) -> bool:
                if await _polls(client, queue, kind, worker.pid):
                    return True
                assert worker.proc.poll() is None, worker.output()
                return False

            # a new build's first poll may wait out a long poll (~60 s)
            await wait_until(polled, f"a poller on {queue}", timeout=120, interval=0.2)

        # 1. The temporal CLI starts the pipeline and prints its result.
        workflow_id = f"redact-ticket-{uuid.uuid4().hex[:8]}"
        started = await asyncio.to_thread(
            _run,
            [
                *temporal,
                "workflow",
                "start",
                "--type",
                names.PIPELINE_WORKFLOW,
                "--task-queue",
                pipelines_queue,
                "--workflow-id",
                workflow_id,
                "--input-file",
                str(pipeline_file),
                *conn,
            ],
            env,
            60,
        )
        assert started.returncode == 0, started.stderr
        done = await asyncio.to_thread(
            _run,
            [*temporal, "workflow", "result", "--workflow-id", workflow_id, *conn, "-o", "json"],
            env,
            90,
        )
        assert done.returncode == 0, done.stdout + done.stderr + worker.output()
        result = _cli_result(done.stdout)
        assert result["status"] == "succeeded", result
        assert result["output"] == {"text": REDACTED, "found": {"email": 1, "phone": 1}}
        assert result["steps"]["no-email-left"]["status"] == "succeeded"

        # The plugin's activity ran in that process, on the plugin's queue.
        handle = client.get_workflow_handle(workflow_id)
        events = await history.events(handle)
        scheduled = [
            e.activity_task_scheduled_event_attributes
            for e in events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        ]
        plugin_calls = [a for a in scheduled if a.activity_type.name == "pii-redact"]
        assert [a.task_queue.name for a in plugin_calls] == [settings.queue(PLUGIN_QUEUE)]
        started_by = {
            e.activity_task_started_event_attributes.identity.split("@")[0]
            for e in events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        }
        assert started_by == {str(worker.pid)}
        assert await history.workflow_task_failures(handle) == 0

        # 2. `aiworker run` in that environment checks the pipeline against the
        # full set (the plugin included) and runs it.
        ran = await asyncio.to_thread(
            _run, [str(plugin_env.aiworker), "run", str(pipeline_file), "--json"], env, 90
        )
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert json.loads(ran.stdout)["output"]["text"] == REDACTED

        # 3. The team's own workflow (workflows.py, activities.py) beside aiworker in
        # one interpreter: it runs the redaction pipeline as a child, then its activity.
        ticket = await asyncio.to_thread(
            _run,
            [
                str(plugin_env.python),
                "-c",
                TICKET_SCRIPT,
                host,
                client.namespace,
                f"acme-support{settings.task_queue_suffix}",
                pipelines_queue,
                TICKET,
            ],
            env,
            90,
            cwd=plugin_env.home,
        )
        assert ticket.returncode == 0, ticket.stdout + ticket.stderr + worker.output()
        assert ticket.stdout.strip().startswith("T-"), ticket.stdout

        # 4. The conformance kit, as a plugin's CI runs it, passes on the installed plugin.
        kit = await asyncio.to_thread(
            _run, [str(plugin_env.aiworker), "conformance", "pii-redact"], env, 120
        )
        assert kit.returncode == 0, kit.stdout + kit.stderr + worker.output()
        assert "PASSED: 6 passed, 0 failed, 0 skipped" in kit.stdout, kit.stdout
        assert worker.proc.poll() is None, worker.output()
    finally:
        stopped = worker.terminate()
        worker.close()
    assert stopped == 0, worker.output()  # drained on SIGTERM

    # Without the plugin (the project's own environment) the same pipeline is refused.
    refused = _run([AIWORKER, "run", str(pipeline_file)], worker_env(client, settings, tmp_path))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "field 'worker': unknown worker 'pii-redact'" in refused.stderr


def _cli_result(stdout: str) -> dict[str, Any]:
    """The pipeline's result in ``temporal workflow result -o json`` output."""
    doc = json.loads(stdout)
    assert doc["status"] == "COMPLETED", stdout
    result: dict[str, Any] = doc["result"]
    return result


TICKET_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys, uuid

    from temporalio.client import Client
    from temporalio.worker import Worker

    from activities import open_ticket
    from workflows import TicketWorkflow

    address, namespace, queue, pipelines_queue, text = sys.argv[1:]


    async def main() -> None:
        client = await Client.connect(address, namespace=namespace)
        async with Worker(
            client, task_queue=queue, workflows=[TicketWorkflow], activities=[open_ticket]
        ):
            ticket = await client.execute_workflow(
                TicketWorkflow.run,
                args=[text, pipelines_queue],
                id=f"ticket-{uuid.uuid4().hex[:8]}",
                task_queue=queue,
            )
        print(ticket)


    asyncio.run(main())
    # The SDK's core threads can abort the interpreter at exit (sdk-python#300),
    # after the result is printed; exit as aiworker's own processes do.
    from aiworker.workers.cli.errors import exit_process

    exit_process(0)
    """
)


# --- AIWORKER_WORKER_MODULES -------------------------------------------------------


async def test_worker_modules_add_their_workers_to_pipelines(
    client: Client, settings: Settings
) -> None:
    with_module = settings.model_copy(update={"worker_modules": ("module_workers",)})
    with installed_workers(with_module) as workers:
        assert workers.origin("word-count") == "module module_workers"
        assert workers.origin(names.VALIDATOR) == "builtin"
        assert "word-count" in catalog.current_specs()
        async with running_stack(client, with_module, workers=workers) as stack:
            pipeline = {
                "name": "count",
                "inputs": {"text": "three short words"},
                "steps": [
                    {"id": "count", "worker": "word-count", "input": {"text": "${{ inputs.text }}"}}
                ],
                "output": {"words": "${{ steps.count.outputs.words }}"},
            }
            result = await (await stack.start(pipeline)).result()
    assert result.status == "succeeded", result
    assert result.output == {"words": 3}
    assert "word-count" not in catalog.current_specs()


# --- broken plugins ------------------------------------------------------------------


def _spec(worker_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "worker_id": worker_id,
        "version": "1.0.0",
        "purpose": "a test worker",
        "task_queue": "aiworker-pipelines",
        "input_schema": {"type": "object"},
        "output_schema": {"type": "object"},
        "constraints": {"timeout_seconds": 5},
        "retries": {"max_attempts": 1},
        **fields,
    }


PROMPT_IMPL = {"kind": "prompt", "prompt": "Classify: ${{ input.text }}"}


class Plugins:
    """Crafted plugin packages on ``sys.path``: modules, spec files and distributions."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def module(self, body: str, specs: dict[str, dict[str, Any]] | None = None) -> str:
        """A module with ``body`` (and spec files beside it); returns its import name."""
        name = f"plug_{uuid.uuid4().hex[:10]}"
        (self.root / f"{name}.py").write_text(textwrap.dedent(body))
        for filename, spec in (specs or {}).items():
            (self.root / filename).write_text(json.dumps(spec))
        return name

    def dist(self, name: str, entry_points: dict[str, str]) -> list[importlib.metadata.EntryPoint]:
        """The ``aiworker.plugins`` entry points of an installed-looking distribution."""
        info = self.root / f"{name.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(
            f"[{ENTRY_POINT_GROUP}]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items())
        )
        return list(importlib.metadata.PathDistribution(info).entry_points)

    def path(self, filename: str) -> Path:
        return self.root / filename


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Plugins]:
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    yield Plugins(root)


WORKER_CLASS = """
    from pathlib import Path
    from typing import Any

    import aiworker


    class Redact(aiworker.Worker):
        spec = aiworker.WorkerSpec.from_file(Path(__file__).with_name({file!r}))

        async def execute(self, ctx: aiworker.Context, input: dict[str, Any]) -> aiworker.Result:
            return aiworker.Result(outputs={{}})
"""


def _load(settings: Settings, eps: list[importlib.metadata.EntryPoint]) -> str:
    with pytest.raises(PluginError) as e:
        load_workers(settings, entry_points=eps)
    return str(e.value)


def test_a_plugin_that_raises_on_import(plugins: Plugins, settings: Settings) -> None:
    mod = plugins.module("raise RuntimeError('ACME_PII_KEY is not set')\n")
    eps = plugins.dist("acme-broken", {"redact": f"{mod}:Redact"})
    assert _load(settings, eps) == (
        f"plugin acme-broken:redact ({mod}:Redact) failed to import: "
        "RuntimeError: ACME_PII_KEY is not set"
    )
    # An entry point made by hand has no distribution: the plugin is named all the same.
    bare = importlib.metadata.EntryPoint("redact", f"{mod}:Redact", ENTRY_POINT_GROUP)
    assert _load(settings, [bare]).startswith(f"plugin redact ({mod}:Redact) failed to import")


@pytest.mark.parametrize(
    ("attr", "held"),
    [
        ("VERSION", "is a str, not a Worker"),
        ("MAPPING", "is a dict, not a Worker"),
        ("helper", "is a function, not a Worker"),
        ("LISTED", "holds 42, which is not a Worker"),
        ("Plain", "holds <class"),
        ("NoSpec", "NoSpec has no spec"),
        ("NoExecute", "NoExecute does not implement execute"),
        ("SyncExecute", "SyncExecute.execute must be 'async def'"),
        ("NeedsArgs", "NeedsArgs() failed: TypeError"),
    ],
)
def test_an_entry_point_that_names_something_else(
    plugins: Plugins, settings: Settings, attr: str, held: str
) -> None:
    mod = plugins.module(
        """
        from typing import Any

        import aiworker

        VERSION = "1.0"
        MAPPING = {"x": 1}
        LISTED = [42]


        def helper() -> None: ...


        class Plain: ...


        class NoSpec(aiworker.Worker):
            async def execute(self, ctx: Any, input: Any) -> Any: ...


        class NoExecute(aiworker.Worker):
            spec = aiworker.WorkerSpec.model_validate(SPEC)


        class SyncExecute(aiworker.Worker):
            spec = SPEC

            def execute(self, ctx: Any, input: Any) -> Any: ...


        class NeedsArgs(aiworker.Worker):
            spec = SPEC

            def __init__(self, key: str) -> None: ...

            async def execute(self, ctx: Any, input: Any) -> Any: ...
        """.replace("SPEC", repr(_spec("odd")))
    )
    eps = plugins.dist("acme-odd", {"odd": f"{mod}:{attr}"})
    message = _load(settings, eps)
    assert message.startswith(f"plugin acme-odd:odd ({mod}:{attr})"), message
    assert held in message, message
    assert message.count(f"({mod}:{attr})") == 1, message  # named once


def test_a_spec_file_that_fails_the_model_is_named_with_its_field(
    plugins: Plugins, settings: Settings
) -> None:
    bad = _spec("redact", constraints={"timeout_seconds": 0})
    mod = plugins.module(WORKER_CLASS.format(file="redact.json"), {"redact.json": bad})
    eps = plugins.dist("acme-pii-bad", {"redact": f"{mod}:Redact"})
    assert _load(settings, eps) == (
        f"plugin acme-pii-bad:redact ({mod}:Redact) failed to import: ValueError: "
        f"worker spec {plugins.path('redact.json')}: constraints.timeout_seconds: "
        "Input should be greater than 0"
    )


def test_a_spec_given_as_a_dict_is_named_by_its_class(plugins: Plugins, settings: Settings) -> None:
    mod = plugins.module(
        """
        import aiworker


        class Redact(aiworker.Worker):
            spec = SPEC
        """.replace("SPEC", repr(_spec("Redact")))
    )
    message = _load(settings, plugins.dist("acme-dict", {"redact": f"{mod}:Redact"}))
    assert message.startswith(f"plugin acme-dict:redact ({mod}:Redact) failed to import: "), message
    assert f"Redact.spec ({plugins.path(mod + '.py')}): worker_id: String should match" in message


def test_a_worker_class_whose_spec_says_prompt(plugins: Plugins, settings: Settings) -> None:
    prompt = _spec(
        "classify",
        implementation=PROMPT_IMPL,
        input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
        constraints={"timeout_seconds": 5, "tools_allowed": ["language_model"]},
    )
    # A spec file path: the file is named.
    mod = plugins.module(
        """
        import aiworker


        class Classify(aiworker.Worker):
            spec = "classify.json"

            async def execute(self, ctx, input): ...
        """,
        {"classify.json": prompt},
    )
    message = _load(settings, plugins.dist("acme-classify", {"classify": f"{mod}:Classify"}))
    assert message.startswith(
        f"plugin acme-classify:classify ({mod}:Classify) failed to import: ValueError: "
        f"worker spec {plugins.path('classify.json')}: implementation.kind is 'prompt', "
        "but Classify is a Worker class"
    ), message
    # A spec read with WorkerSpec.from_file: the class and its module file are named.
    mod = plugins.module(WORKER_CLASS.format(file="classify.json"))
    message = _load(settings, plugins.dist("acme-classify2", {"classify": f"{mod}:Redact"}))
    assert (
        f"Redact.spec ({plugins.path(mod + '.py')}): implementation.kind is 'prompt'" in message
    ), message


def test_two_workers_with_one_id(plugins: Plugins, settings: Settings) -> None:
    # plugin vs built-in
    mod = plugins.module(
        WORKER_CLASS.format(file="validator.json"), {"validator.json": _spec(names.VALIDATOR)}
    )
    eps = plugins.dist("acme-validator", {"strict-validator": f"{mod}:Redact"})
    assert _load(settings, eps) == (
        "worker_id 'validator' is defined twice: by builtin and by "
        f"plugin acme-validator:strict-validator ({plugins.path(mod + '.py')})"
    )
    # plugin vs plugin
    first = plugins.module(WORKER_CLASS.format(file="same.json"), {"same.json": _spec("same")})
    second = plugins.module(WORKER_CLASS.format(file="same.json"))
    eps = plugins.dist("acme-a", {"a": f"{first}:Redact"}) + plugins.dist(
        "acme-b", {"b": f"{second}:Redact"}
    )
    assert _load(settings, eps) == (
        f"worker_id 'same' is defined twice: by plugin acme-a:a ({plugins.path(first + '.py')}) "
        f"and by plugin acme-b:b ({plugins.path(second + '.py')})"
    )
    # plugin vs a spec file in AIWORKER_WORKER_SPECS
    folder = plugins.root / "specs"
    folder.mkdir()
    (folder / "same.json").write_text(
        json.dumps(_spec("same", implementation={"kind": "external"}))
    )
    with_specs = settings.model_copy(update={"worker_specs": (folder,)})
    assert _load(with_specs, plugins.dist("acme-c", {"c": f"{first}:Redact"})) == (
        f"worker_id 'same' is defined twice: by plugin acme-c:c ({plugins.path(first + '.py')}) "
        f"and by file {folder / 'same.json'}"
    )


def test_a_plugin_may_ship_prompt_workers_built_from_its_spec_files(
    plugins: Plugins, settings: Settings
) -> None:
    prompt = _spec(
        "classify",
        implementation=PROMPT_IMPL,
        input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
        constraints={"timeout_seconds": 5, "tools_allowed": ["language_model"]},
    )
    mod = plugins.module(
        """
        from pathlib import Path

        from aiworker import WorkerSpec
        from aiworker.activities.prompt import PromptWorker

        WORKERS = [PromptWorker(WorkerSpec.from_file(Path(__file__).with_name("classify.json")))]
        """,
        {"classify.json": prompt},
    )
    workers = load_workers(settings.model_copy(update={"worker_modules": (mod,)}))
    assert workers.origin("classify") == f"module {mod}"
    assert workers.specs["classify"].kind == "prompt"
    assert "classify" in workers.served


def test_a_worker_module_without_workers_registers_nothing(
    plugins: Plugins, settings: Settings
) -> None:
    empty = plugins.module("HELPERS = []\n")
    # A good module first: it is loaded, but not installed, when the next one fails.
    broken = settings.model_copy(update={"worker_modules": ("module_workers", empty)})
    with pytest.raises(StartupError) as e:
        load_process_workers(broken)
    assert str(e.value) == (
        f"module {empty} (AIWORKER_WORKER_MODULES) has no WORKERS (an iterable of workers "
        f"or worker classes); file {plugins.path(empty + '.py')}"
    )
    assert set(catalog.current_specs()) == set(load_specs())


def test_a_broken_plugin_stops_the_worker_process_with_one_line(
    plugins: Plugins, client: Client, settings: Settings, tmp_path: Path
) -> None:
    bad = _spec("redact", retries={"max_attempts": 0})
    mod = plugins.module(WORKER_CLASS.format(file="redact.json"), {"redact.json": bad})
    env = worker_env(client, settings, tmp_path / "data")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(plugins.root), os.environ.get("PYTHONPATH")) if p
    )
    env["AIWORKER_WORKER_MODULES"] = mod
    expected = (
        f"aiworker: module {mod} (AIWORKER_WORKER_MODULES) failed to import: ValueError: "
        f"worker spec {plugins.path('redact.json')}: retries.max_attempts: "
        "Input should be greater than or equal to 1"
    )
    for command in (["worker"], ["workers"]):
        result = _run([AIWORKER, *command], env, timeout=90)
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.splitlines() == [expected], result.stderr


def test_a_prompt_worker_naming_an_undefined_alias_is_reported_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from aiworker.workers.process.resources import build_language_model, build_runtime

    examples = Path(__file__).resolve().parents[2] / "examples" / "prompts"
    settings = Settings(data_dir=tmp_path, worker_specs=(examples,))
    ws = load_workers(settings, entry_points=[])
    caplog.set_level(logging.WARNING, logger="aiworker")
    # no model configured: the process has no `default` alias
    lm = build_language_model(settings, env={})
    build_runtime(settings, tools={"language_model": lm}, workers=ws)
    named = {
        r.aiworker["worker_id"]: r.aiworker  # type: ignore[attr-defined]
        for r in caplog.records
        if getattr(r, "aiworker", {}).get("event") == "model_alias_unknown"
    }
    assert set(named) == {"classify-ticket", "tag-product"}
    assert named["classify-ticket"]["alias"] == "default"
    assert named["classify-ticket"]["origin"].endswith("classify-ticket.json")

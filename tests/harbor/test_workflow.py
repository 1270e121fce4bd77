"""Workflow mode: the rollout's own AgentWorkflow and Grader run inside the trial's container.

Without podman: the configuration (health, configs, import paths), what a trial is staged with
(the label only under ``tests/``, the harness's kwargs, the overlay's network mode, the Harbor
child's environment) and how the container's result files become the outcome.

With real podman: a rollout server that no supervisor asked probes its route by itself (slirp).
With real podman and Harbor, through the real ``rollbridge eval run`` (two runs):

- ``configs/eval/workflow.toml``: three rows through the route the probe picks (slirp on
  podman); each row's tokens are the bridge's count of its own two calls (the SDK's ``chat``
  and the official ``openai`` client); the reward is the Grader's; no retained file holds a byte
  of the bearer; no container is left.
- a test workflow with ``HARBOR_NETWORK=none`` (the exec relay is the only way out): it greps
  the whole container for the row's label during the agent phase (never found; a control
  string it wrote itself is found), sees only ``lo``, still calls the model; the Grader sees the
  label; a row whose workflow raises is failed with the workflow's own exception as its reason.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import subprocess
import sys
import types
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from rollout_server import AgentWorkflow, AgentWorkflowContext, Grader, GraderContext
from rollout_server.backend import ExecutionRequest
from rollout_server.harbor import HarborBackend
from rollout_server.harbor.containers import OWNER_LABEL, owner_alive, owner_token
from rollout_server.harbor.image import SandboxImage, trial_dockerfile
from rollout_server.harbor.placement import AGENT_PATH, Placement, SandboxTrial
from rollout_server.harbor.results import workflow_outcome
from rollout_server.harbor.route import SLIRP_NETWORK_MODE, SandboxRoute
from rollout_server.harbor.workflow import HARNESS_AGENT, import_path_of
from rollout_server.protocol import RolloutErrorCategory, RolloutStatus
from rollout_server.sdk import RolloutContext, set_rollout_context
from tests.harbor.conftest import EXAMPLE, IMAGE, labelled_containers
from tests.launcher.e2e.helpers import journal, run_cli, run_dir, start_cli, wait_for

TASK = EXAMPLE / "workflow_tasks" / "echo"
BEARER = "sk-workflow-bearer-0123456789abcdef"
HERE = "tests.harbor.test_workflow"


class Workflow(AgentWorkflow[Any]):
    async def run(self, ctx: AgentWorkflowContext[Any]) -> None:
        return None


class LabelGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        ctx.set_reward(1.0)


@dataclasses.dataclass
class Settings:
    depth: int = 2


def _backend(**kwargs: Any) -> HarborBackend:
    kwargs.setdefault("grader", LabelGrader)
    return HarborBackend(TASK, workflow=Workflow, reap_orphans=False, **kwargs)


# -- configuration (no podman) ---------------------------------------------------------------


@pytest.mark.parametrize(("environment", "public"), [("podman", False), ("daytona", True)])
def test_health_offers_the_probe_and_needs_no_public_url_on_a_local_engine(
    environment: str, public: bool
) -> None:
    health = _backend(environment_type=environment).health()
    assert health["agent"] == HARNESS_AGENT
    assert health["chat_endpoint"] == {
        "environment": environment,
        "requires_public_url": public,
        "probe": "/v1/rollbridge/probe-chat-endpoint",
    }


async def test_a_host_side_agent_has_no_probe() -> None:
    oracle = HarborBackend(TASK, agent="oracle", reap_orphans=False)
    assert "probe" not in oracle.health()["chat_endpoint"]
    assert await oracle.probe_chat_endpoint({"nonce": "n", "candidates": []}) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"config": object()}, "config must be None, a JSON-able dict or a dataclass instance"),
        ({"config": {"x": float("nan")}}, "config is not JSON-able"),
        ({"grader": str}, "grader must be a Grader subclass or None"),
        ({"sandbox_network": "host"}, "sandbox_network must be 'auto' or 'none'"),
    ],
)
def test_unusable_workflow_arguments_are_one_line_errors(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        _backend(**kwargs)
    assert "\n" not in str(caught.value)
    with pytest.raises(ValueError, match="need workflow="):
        HarborBackend(TASK, config={"a": 1}, reap_orphans=False)


def test_classes_are_named_as_the_container_imports_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _backend(config=Settings(3)).workflow_spec
    assert spec is not None
    assert (spec.workflow, spec.grader) == (f"{HERE}:Workflow", f"{HERE}:LabelGrader")
    assert (spec.config, spec.config_type) == ({"depth": 3}, f"{HERE}:Settings")
    # A class of the entrypoint (__main__) is named by its file under the project root.
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "sub").mkdir()
    entry = types.ModuleType("__main__")
    entry.__file__ = str(tmp_path / "sub" / "entry.py")
    monkeypatch.setitem(sys.modules, "__main__", entry)
    cls = type("Main", (Workflow,), {"__module__": "__main__"})
    assert import_path_of(cls, tmp_path) == "sub.entry:Main"


def _sandbox(route: SandboxRoute, network: str = "auto") -> SandboxTrial:
    placement = Placement(engine="podman", network=network, owner="1:2")
    url = "http://127.0.0.1:4321/v1/rollouts/r1"
    image = SandboxImage("localhost/rollbridge-sandbox:abc", "abc", "3.11.2")
    return SandboxTrial(image, route, placement.wiring(route, url), "rollbridge_rollout")


def test_a_trial_is_staged_with_the_label_only_in_its_tests(tmp_path: Path) -> None:
    label = f"label-{secrets.token_hex(6)}"
    backend = _backend(trials_root=tmp_path)
    request = ExecutionRequest(
        id="r1",
        prompt=[{"role": "user", "content": "repeat"}],
        label=label,
        metadata={"k": 1},
        agent_timeout_sec=100,
    )
    route = SandboxRoute("slirp", "http://10.0.2.2:4321", SLIRP_NETWORK_MODE)
    sandbox = _sandbox(route)
    staged = backend._stage(request, "http://127.0.0.1:4321/v1/rollouts/r1", sandbox)
    task = staged.task_dir
    assert json.loads((task / "tests" / "label.json").read_text())["label"] == label
    assert "rollout_server.sandbox grade" in (task / "tests" / "test.sh").read_text()
    dockerfile = (task / "environment" / "Dockerfile").read_text()
    assert dockerfile == trial_dockerfile(sandbox.image, trial="trial-r1")
    # Each trial's own: two trials' builds never share a cached layer one teardown can remove.
    assert 'io.rollbridge.sandbox.trial="trial-r1"' in dockerfile
    overlay = json.loads(staged.overlay.read_text())["services"]["main"]
    assert overlay["network_mode"] == SLIRP_NETWORK_MODE
    config = json.loads(staged.config.read_text())
    assert config["agent"]["import_path"] == HARNESS_AGENT
    kwargs = config["agent"]["kwargs"]
    assert kwargs["workflow"] == f"{HERE}:Workflow"
    assert kwargs["package_dir_name"] == "rollbridge_rollout"
    assert kwargs["metadata"] == {"k": 1} and kwargs["timeout_sec"] == 100
    assert config["agent"]["override_timeout_sec"] > 100  # the runner's own deadline is first
    assert config["verifier"]["disable"] is False
    # Everything but tests/ reaches the agent: the label is nowhere else in the staging.
    outside = [p for p in staged.staging.rglob("*") if p.is_file() and "tests" not in p.parts]
    assert outside and all(label.encode() not in p.read_bytes() for p in outside)


def test_the_harbor_child_gets_the_sandbox_url_and_the_relay_target() -> None:
    backend = _backend(sandbox_network="none")
    relay = SandboxRoute("relay", "http://127.0.0.1:13131", None, ("127.0.0.1", 4321))
    sandbox = _sandbox(relay, network="none")
    assert sandbox.wiring.network_mode == "none"
    url = "http://127.0.0.1:4321/v1/rollouts/r1"
    env = backend._child_env(
        ["/x/bin/harbor"], BEARER, url, trial="trial-r1", wiring=sandbox.wiring
    )
    assert env["ROLLBRIDGE_SANDBOX_URL"] == "http://127.0.0.1:13131/v1/rollouts/r1"
    assert env["ROLLBRIDGE_RELAY_TARGET"] == "127.0.0.1:4321"
    assert env["ROLLBRIDGE_TRIAL"] == "trial-r1"
    assert env["OPENAI_API_KEY"] == BEARER
    assert env["PYTHONPATH"].split(":")[0] == str(AGENT_PATH)
    assert (AGENT_PATH / "rollbridge_harness.py").is_file()


async def test_a_sandbox_image_that_cannot_be_made_fails_the_rollout_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The image is refused before Harbor would run: any executable stands in for Harbor's CLI,
    # so this holds on a machine without the sandbox test bed too.
    monkeypatch.setenv("ROLLBRIDGE_HARBOR", "/bin/true")
    backend = _backend(environment_type="daytona")
    request = ExecutionRequest(id="r1", prompt=[{"role": "user", "content": "hi"}])
    url = "http://127.0.0.1:9/v1/rollouts/r1"
    set_rollout_context(RolloutContext(chat_completions_url=url, api_key=BEARER, rollout_id="r1"))
    try:
        with trio.fail_after(30):
            outcome = await backend.execute(request)
    finally:
        set_rollout_context(None)
    reported = outcome.reported()
    assert reported.status == RolloutStatus.FAILURE
    assert reported.err_category == RolloutErrorCategory.INTERNAL_ERROR
    assert reported.err_message is not None and "\n" not in reported.err_message
    assert "workflow mode builds its sandbox image with podman or docker" in reported.err_message


def _result(**extra: Any) -> dict[str, Any]:
    return {"trial_name": "t", "exception_info": None, **extra}


def test_the_containers_own_failures_are_the_rows_reasons() -> None:
    failure = {"stage": "workflow", "type": "ValueError", "message": f"bad {BEARER}"}
    outcome = workflow_outcome(
        _result(exception_info={"exception_type": "SandboxRunError"}),
        {"status": "failure", "failure": failure},
        None,
        prompt=[],
        label="x",
        grade=True,
        scrub=lambda text: text.replace(BEARER, "[REDACTED]"),
    )
    reported = outcome.reported()
    assert reported.status == RolloutStatus.FAILURE
    assert reported.err_message == "bad [REDACTED]"
    assert reported.err_category == RolloutErrorCategory.VALIDATION_ERROR
    assert reported.extra_fields is not None
    assert reported.extra_fields["failure"] == {
        "phase": "agent",
        "type": "ValueError",
        "stage": "workflow",
    }
    graded = workflow_outcome(
        _result(verifier_result={"rewards": {"reward": 0.5}}),
        {"status": "success", "messages": [{"role": "assistant", "content": "a"}], "metrics": {}},
        {"status": "success", "reward": 0.5},
        prompt=[],
        label="x",
        grade=True,
        scrub=str,
    ).reported()
    assert graded.status == RolloutStatus.SUCCESS
    assert graded.sample is not None and graded.sample.reward == 0.5
    grader_failed = workflow_outcome(
        _result(exception_info={"exception_type": "RewardFileNotFoundError"}),
        {"status": "success", "messages": [], "metrics": {}},
        {"status": "failure", "failure": {"stage": "grader", "type": "KeyError", "message": "k"}},
        prompt=[],
        label="x",
        grade=True,
        scrub=str,
    )
    assert grader_failed.workflow.status == RolloutStatus.SUCCESS
    assert grader_failed.reported().err_message == "k"
    assert grader_failed.reported().extra_fields["failure"]["phase"] == "grader"  # type: ignore[index]


# -- real podman and Harbor ------------------------------------------------------------------


async def _answer_anything(stream: trio.SocketStream) -> None:
    with trio.move_on_after(10):
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(4096)
            if not chunk:
                return
            data += chunk
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
        )
    await stream.aclose()


@pytest.mark.usefixtures("testbed")
async def test_a_server_no_supervisor_probed_finds_its_route_itself(
    nursery: trio.Nursery,
) -> None:
    """The reference CLI never asks: the first in-sandbox trial probes with the loopback URL."""
    listeners = await nursery.start(partial(trio.serve_tcp, _answer_anything, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    placement = Placement(engine="podman", network="auto", owner=owner_token())
    url = f"http://127.0.0.1:{port}/v1/rollouts/r1"
    with trio.fail_after(120):
        route = await placement.ensure_route(IMAGE, url)
    assert (route.kind, route.network_mode) == ("slirp", SLIRP_NETWORK_MODE)
    assert placement.wiring(route, url).chat_url == f"http://10.0.2.2:{port}/v1/rollouts/r1"
    report = placement.report
    assert report is not None
    assert [a.outcome for a in report.attempts] == ["refused", "reached"]
    _no_orphans_left()


def _trial_bearer() -> str | None:
    """The bearer a live trial's Harbor process got (``OPENAI_API_KEY``): its only place."""
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if any(arg.endswith("harbor/_watchdog.py") for arg in cmd):
            try:
                key = proc.environ().get("OPENAI_API_KEY")
            except psutil.Error:
                continue
            if key:
                return key
    return None


def _no_orphans_left() -> None:
    assert labelled_containers() == []
    listed = subprocess.run(
        ["podman", "ps", "-a", "--filter", f"label={OWNER_LABEL}", "--format", "json"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    owners = [row["Labels"][OWNER_LABEL] for row in json.loads(listed.stdout or b"[]")]
    assert all(owner_alive(owner) for owner in owners), owners


def _index(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "index.jsonl").read_text().splitlines()]


def _container_result(run: Path, rollout_id: str) -> dict[str, Any]:
    path = run / "rollout_trials" / rollout_id / "harbor" / "agent" / "container_result.json"
    document: dict[str, Any] = json.loads(path.read_text())
    return document


@pytest.mark.timeout(600)
@pytest.mark.usefixtures("testbed")
async def test_three_rows_run_their_workflow_in_the_sandbox(
    harbor_workspace: Path, harbor_env: dict[str, str], tmp_path: Path
) -> None:
    args = ["eval", "run", "ws/configs/eval/workflow.toml", "--yes", "--name", "wf"]
    run = run_dir(harbor_workspace, "wf")
    live = await start_cli(args, cwd=tmp_path, env=harbor_env, logdir=tmp_path / "out")
    found: list[str] = []

    def bearer_seen() -> bool:
        key = _trial_bearer()
        if key:
            found.append(key)
        return bool(key) or live.process.returncode is not None

    await wait_for(bearer_seen, timeout=400, interval=0.2)
    result = await live.wait(timeout=500)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "sandboxes reach the bridge through slirp" in result.stdout
    records = journal(run)
    assert sorted((r["status"], r.get("reward")) for r in records) == [("success", 1.0)] * 3
    index = _index(run)
    assert len({row["rollout_id"] for row in index}) == 3
    for row in index:
        # Two identical calls (the SDK's chat, then the openai client streaming), each of the
        # row's own prompt, both counted by the bridge under this rollout's id (the streamed
        # call's usage included).
        assert row["tokens"] > 0 and row["tokens"] == 2 * row["max_context_tokens"], row
        container = _container_result(run, row["rollout_id"])
        assert container["status"] == "success"
        # The echo model streams one chunk per word of the prompt.
        words = len(container["messages"][0]["content"].split())
        assert container["metrics"] == {"clients_agree": 1.0, "streamed_chunks": float(words)}
        assert container["messages"][-1]["content"] == container["messages"][0]["content"]
    assert {r["rollout_id"]: r["tokens"] for r in records} == {
        r["rollout_id"]: r["tokens"] for r in index
    }
    assert found, "no trial process carried the bridge bearer"
    files = [p for p in run.rglob("*") if p.is_file()]
    assert any(p.name == "container_result.json" for p in files)
    for path in files:
        assert found[0].encode() not in path.read_bytes(), path
    assert found[0] not in result.stdout + result.stderr
    _no_orphans_left()


SCAN = '''"""Test workflow: looks for the row's label in every file of its container."""

import json
import os

import trio

from rollout_server import AgentWorkflow, AgentWorkflowOutput, Grader, chat, reply_text

# Joined only at run time: no file holds either string whole until the workflow writes one.
LABEL_PARTS = ("lbl", "{a}", "{b}")
CONTROL_PARTS = ("ctl", "{b}", "{a}")
_SKIP = ("/proc", "/sys", "/dev")


def _scan(needles):
    hits = {{needle: [] for needle in needles}}
    for dirpath, dirnames, filenames in os.walk("/"):
        dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) not in _SKIP]
        for name in filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            try:
                with open(path, "rb") as handle:
                    data = handle.read(256 << 20)
            except OSError:
                continue
            for needle in needles:
                if needle in data:
                    hits[needle].append(path)
    return hits


class ScanWorkflow(AgentWorkflow):
    async def run(self, ctx):
        if ctx.metadata and ctx.metadata.get("explode"):
            raise ValueError("designed to fail " + ctx.metadata["explode"])
        label = "-".join(LABEL_PARTS).encode()
        control = "-".join(CONTROL_PARTS).encode()
        with open("/tmp/rollbridge-control.txt", "wb") as handle:
            handle.write(control)
        hits = await trio.to_thread.run_sync(_scan, [label, control])
        reply = reply_text(await chat(list(ctx.prompt)))
        report = {{
            "label_hits": hits[label],
            "control_hits": hits[control],
            "interfaces": sorted(os.listdir("/sys/class/net")),
        }}
        return AgentWorkflowOutput(
            messages=[
                *ctx.prompt,
                {{"role": "assistant", "content": reply}},
                {{"role": "tool", "content": json.dumps(report)}},
            ],
            metrics={{"label_hits": len(hits[label]), "control_hits": len(hits[control])}},
        )


class ScanGrader(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0 if ctx.label == "-".join(LABEL_PARTS) else 0.0)
'''

SCAN_MAIN = """from pathlib import Path

from rollout_server import serve
from rollout_server.harbor import HarborBackend
from scan import ScanGrader, ScanWorkflow

WORKSPACE = Path(__file__).resolve().parents[2]

if __name__ == "__main__":
    serve(
        HarborBackend(
            WORKSPACE / "workflow_tasks" / "echo",
            environment_type="podman",
            workflow=ScanWorkflow,
            grader=ScanGrader,
            sandbox_network="none",
            concurrency=2,
        )
    )
"""


@pytest.mark.timeout(600)
@pytest.mark.usefixtures("testbed")
async def test_offline_sandbox_never_sees_the_label_and_reports_the_workflows_error(
    harbor_workspace: Path, harbor_env: dict[str, str], tmp_path: Path
) -> None:
    a, b = secrets.token_hex(6), secrets.token_hex(6)
    label = f"lbl-{a}-{b}"
    rollout = harbor_workspace / "rollouts" / "harbor_hello"
    (rollout / "scan.py").write_text(SCAN.format(a=a, b=b))
    (rollout / "main.py").write_text(SCAN_MAIN)
    nonce = secrets.token_hex(6)
    rows = [
        {"user_prompt": "Say something.", "ground_truth": label},
        {"user_prompt": "Fail.", "ground_truth": label, "metadata": {"explode": nonce}},
    ]
    (harbor_workspace / "data" / "hello.jsonl").write_text(
        "".join(json.dumps(row) + "\n" for row in rows)
    )
    args = ["eval", "run", "ws/configs/eval/offline.toml", "--yes", "--name", "scan"]
    result = await run_cli(args, cwd=tmp_path, env=harbor_env, timeout=540)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "sandboxes reach the bridge through relay" in result.stdout
    run = run_dir(harbor_workspace, "scan")
    by_row = {r["row_index"]: r for r in journal(run)}
    assert by_row[0]["status"] == "success" and by_row[0]["reward"] == 1.0  # the Grader saw it
    assert by_row[1]["status"] == "failed"
    assert by_row[1]["error"] == {
        "phase": "agent",
        "type": "ValueError",
        "message": f"designed to fail {nonce}",
    }
    assert f"agent: ValueError: designed to fail {nonce}" in result.stdout
    [ok] = [row for row in _index(run) if row["row_index"] == 0]
    assert ok["tokens"] > 0  # the model call went through the relay
    report = json.loads(_container_result(run, ok["rollout_id"])["messages"][-1]["content"])
    assert report["label_hits"] == []
    assert report["control_hits"] == ["/tmp/rollbridge-control.txt"]  # the scan does find
    assert report["interfaces"] == ["lo"]  # network_mode none: only the relay gets out
    _no_orphans_left()

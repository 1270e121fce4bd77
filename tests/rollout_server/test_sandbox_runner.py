"""The in-sandbox runner (``python -m rollout_server.sandbox agent|grade``) without a sandbox.

The runner's files live in a temp dir; the workflows and graders are classes of this module,
named ``module:Qualname`` as the backend names them; the model endpoint is a small real HTTP
server on 127.0.0.1:0.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from rollout_server import (
    AgentWorkflow,
    AgentWorkflowContext,
    AgentWorkflowOutput,
    Grader,
    GraderContext,
    chat,
    get_rollout_context,
    reply_text,
)
from rollout_server.harbor.workflow import encode_config
from rollout_server.sandbox import runner

HERE = "tests.rollout_server.test_sandbox_runner"
BEARER = "sk-sandbox-bearer-0123456789"


@dataclasses.dataclass
class Settings:
    greeting: str
    times: int = 1


class ModelWorkflow(AgentWorkflow[Any]):
    """One call through the SDK's chat helper; reports what the runner set up."""

    async def run(self, ctx: AgentWorkflowContext[Any]) -> AgentWorkflowOutput:
        rollout = get_rollout_context()
        assert rollout is not None
        reply = reply_text(await chat(list(ctx.prompt)))
        seen = {
            "OPENAI_BASE_URL": os.environ.get("OPENAI_BASE_URL"),
            "OPENAI_API_KEY_is_bearer": os.environ.get("OPENAI_API_KEY") == BEARER,
            "ctx_url": rollout.chat_completions_url,
            "config": repr(self.config),
            "metadata": ctx.metadata,
        }
        return AgentWorkflowOutput(
            messages=[
                *ctx.prompt,
                {"role": "assistant", "content": reply},
                {"role": "tool", "content": json.dumps(seen)},
            ],
            metrics={"calls": 1},
        )


class FailingWorkflow(AgentWorkflow[Any]):
    async def run(self, ctx: AgentWorkflowContext[Any]) -> None:
        raise ValueError("no answer for you")


class SlowWorkflow(AgentWorkflow[Any]):
    async def run(self, ctx: AgentWorkflowContext[Any]) -> None:
        await trio.sleep(30)


class LabelGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        if ctx.metadata and ctx.metadata.get("explode"):
            raise RuntimeError("grader exploded")
        text = str(ctx.sample.messages[-1].get("content"))
        ctx.set_reward(1.0 if ctx.label and ctx.label in text else 0.0)


class Chat:
    """A one-route chat endpoint: records each request, answers with the last user message."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self.port = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        while len(body) < int(headers.get("content-length", "0")):
            body += await stream.receive_some(65536)
        document = json.loads(body)
        self.requests.append((lines[0].split()[1], headers, document))
        text = document["messages"][-1]["content"]
        answer = json.dumps(
            {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
        ).encode()
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
            + f"Content-Length: {len(answer)}\r\n\r\n".encode()
            + answer
        )
        await stream.aclose()


@pytest.fixture
async def model(nursery: trio.Nursery) -> Chat:
    server = Chat()
    listeners = await nursery.start(partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1"))
    server.port = listeners[0].socket.getsockname()[1]
    return server


@pytest.fixture
def clean_env() -> Iterator[None]:
    """The runner exports the endpoint into its process env; undo that after each test."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def _input(tmp: Path, workflow: str, **fields: Any) -> Path:
    document = {
        "rollout_id": "r-1",
        "chat_completions_url": fields.pop("url", "http://127.0.0.1:9/v1/rollouts/r-1"),
        "api_key": BEARER,
        "prompt": [{"role": "user", "content": "say hello"}],
        "metadata": {"row": 7},
        "workflow": workflow,
        "grader": f"{HERE}:LabelGrader",
        "config": None,
        "config_type": None,
        "package_dir_name": None,
        "timeout_sec": None,
        **fields,
    }
    path = tmp / "container_input.json"
    path.write_text(json.dumps(document))
    return path


async def _agent(tmp: Path, input_path: Path) -> tuple[int, dict[str, Any]]:
    with trio.fail_after(20):
        code = await runner.run_agent(input_path, tmp / "container_result.json", tmp / "art")
    return code, json.loads((tmp / "container_result.json").read_text())


@pytest.mark.usefixtures("clean_env")
async def test_agent_runs_the_workflow_with_the_rollout_context_and_the_openai_env(
    tmp_path: Path, model: Chat
) -> None:
    url = f"http://127.0.0.1:{model.port}/v1/rollouts/r-1"
    config, config_type = encode_config(Settings("hi", 3))
    source = _input(
        tmp_path, f"{HERE}:ModelWorkflow", url=url, config=config, config_type=config_type
    )
    code, result = await _agent(tmp_path, source)
    assert code == 0, result
    assert not source.exists()  # the bearer's file is gone once read
    assert result["status"] == "success" and result["failure"] is None
    assert result["metrics"] == {"calls": 1.0}
    assert result["messages"][1] == {"role": "assistant", "content": "say hello"}
    seen = json.loads(result["messages"][2]["content"])
    # `openai` appends /chat/completions to OPENAI_BASE_URL: the rollout's URL as it is.
    assert seen["OPENAI_BASE_URL"] == url and seen["ctx_url"] == url
    assert seen["OPENAI_API_KEY_is_bearer"] is True
    assert seen["config"] == "Settings(greeting='hi', times=3)"
    assert seen["metadata"] == {"row": 7}
    [(path, headers, body)] = model.requests
    assert path == "/v1/rollouts/r-1/chat/completions"
    assert headers["authorization"] == f"Bearer {BEARER}"
    assert body["messages"] == [{"role": "user", "content": "say hello"}]
    assert BEARER not in (tmp_path / "container_result.json").read_text()


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize(
    ("workflow", "fields", "stage", "kind", "message"),
    [
        ("FailingWorkflow", {}, "workflow", "ValueError", "no answer for you"),
        ("SlowWorkflow", {"timeout_sec": 0.2}, "workflow", "TimeoutError", "0.2s deadline"),
        ("NoSuchWorkflow", {}, "import", "AttributeError", "NoSuchWorkflow"),
        ("ModelWorkflow", {"config_type": f"{HERE}:Chat", "config": {}}, "config", "TypeError", ""),
    ],
)
async def test_agent_failures_name_their_stage_type_and_message(
    tmp_path: Path, workflow: str, fields: dict[str, Any], stage: str, kind: str, message: str
) -> None:
    source = _input(tmp_path, f"{HERE}:{workflow}", **fields)
    code, result = await _agent(tmp_path, source)
    assert code == 1
    assert not source.exists()
    failure = result["failure"]
    assert (result["status"], failure["stage"], failure["type"]) == ("failure", stage, kind)
    assert message in failure["message"]


@pytest.mark.usefixtures("clean_env")
async def test_unreadable_input_is_a_failure_of_the_input_stage(tmp_path: Path) -> None:
    (tmp_path / "container_input.json").write_text("{not json")
    code, result = await _agent(tmp_path, tmp_path / "container_input.json")
    assert code == 1
    assert result["failure"]["stage"] == "input"
    assert not (tmp_path / "container_input.json").exists()


def _grade_files(tmp: Path, *, label: str, metadata: Any = None, status: str = "success") -> None:
    (tmp / "container_result.json").write_text(
        json.dumps(
            {
                "status": status,
                "messages": [{"role": "assistant", "content": "it is hello"}],
                "metrics": {"calls": 1},
            }
        )
    )
    (tmp / "label.json").write_text(
        json.dumps(
            {
                "label": label,
                "metadata": metadata,
                "grader": f"{HERE}:LabelGrader",
                "grader_config": None,
                "grader_config_type": None,
                "package_dir_name": None,
            }
        )
    )


async def _grade(tmp: Path) -> tuple[int, dict[str, Any], Path]:
    reward = tmp / "verifier" / "reward.json"
    with trio.fail_after(20):
        code = await runner.run_grade(
            tmp / "container_result.json",
            tmp / "label.json",
            reward,
            tmp / "verifier" / "grade_result.json",
            None,
        )
    return code, json.loads((tmp / "verifier" / "grade_result.json").read_text()), reward


@pytest.mark.parametrize(("label", "reward"), [("hello", 1.0), ("goodbye", 0.0)])
async def test_grade_writes_harbors_reward_file(tmp_path: Path, label: str, reward: float) -> None:
    _grade_files(tmp_path, label=label)
    code, result, reward_file = await _grade(tmp_path)
    assert code == 0
    assert json.loads(reward_file.read_text()) == {"reward": reward}
    assert result == {
        "status": "success",
        "reward": reward,
        "remove_sample": False,
        "failure": None,
    }


@pytest.mark.parametrize(
    ("metadata", "status", "stage", "kind"),
    [
        ({"explode": True}, "success", "grader", "RuntimeError"),
        (None, "failure", "result", "StageError"),
    ],
)
async def test_grade_failures_leave_no_reward_and_say_why(
    tmp_path: Path, metadata: Any, status: str, stage: str, kind: str
) -> None:
    _grade_files(tmp_path, label="hello", metadata=metadata, status=status)
    code, result, reward_file = await _grade(tmp_path)
    assert code == 1
    assert not reward_file.exists()
    assert (result["status"], result["failure"]["stage"], result["failure"]["type"]) == (
        "failure",
        stage,
        kind,
    )


def test_the_package_dir_goes_first_on_sys_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "site" / "rollbridge_rollout_t"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "entry_mod_t.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    runner.use_package_dir("rollbridge_rollout_t")
    assert runner.load_object("entry_mod_t:VALUE") == 42
    with pytest.raises(runner.StageError):
        runner.use_package_dir("no_such_package_t")


def test_the_command_line_says_how_to_use_it() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rollout_server.sandbox", "nonsense"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "usage: python -m rollout_server.sandbox agent|grade" in done.stderr

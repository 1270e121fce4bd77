"""Failures labelled by where they happened (issue 27 item 13), through the real CLI: an agent
that runs past ``agent_workflow_timeout_s`` is ``agent:``, a model call that never reached the
bridge (nothing listens at the advertised URL) is ``network:``, not ``bridge:``."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.launcher.e2e.helpers import run_cli, run_dir, write_config

pytestmark = pytest.mark.slow

PROBE = """
import trio

from rollout_server import AgentWorkflow, AgentWorkflowOutput, Grader, LocalBackend, chat, serve


class Probe(AgentWorkflow):
    async def run(self, ctx):
        text = ctx.prompt[-1]["content"]
        if text == "sleep":
            await trio.sleep(30)
        if text == "chat":
            await chat(list(ctx.prompt))
        return AgentWorkflowOutput(messages=[*ctx.prompt, {"role": "assistant", "content": text}])


class Full(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0)


if __name__ == "__main__":
    serve(LocalBackend(workflow=Probe, grader=Full))
"""


def _setup(workspace: Path, prompts: list[str], timeout: float) -> None:
    (workspace / "rollouts" / "echo" / "probe.py").write_text(PROBE)
    lines = [json.dumps({"user_prompt": p, "ground_truth": "g"}) for p in prompts]
    (workspace / "data" / "probe.jsonl").write_text("\n".join(lines) + "\n")
    write_config(
        workspace,
        "probe",
        "[experiment]\n"
        'rollout = "echo"\nentrypoint = "probe.py"\nmodel_path = "rollbridge/echo"\n'
        'dataset = "probe.jsonl"\n\n'
        f"[evaluation]\nbatch_size = 2\nagent_workflow_timeout_s = {timeout}\n"
        "grader_timeout_s = 30\n\n[secrets]\nrequired = []\n",
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _errors(workspace: Path, name: str) -> list[dict[str, object]]:
    index = run_dir(workspace, name) / "index.jsonl"
    rows = [json.loads(line) for line in index.read_text().splitlines() if line.strip()]
    return [r["error"] for r in sorted(rows, key=lambda r: r["row_index"]) if r.get("error")]


async def test_an_agent_timeout_is_labelled_agent(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    _setup(workspace, ["sleep", "hello"], timeout=1)
    result = await run_cli(
        ["eval", "run", "ws/configs/eval/probe.toml", "--name", "slow", "--yes"],
        cwd=tmp_path,
        env=env,
    )
    errors = _errors(workspace, "slow")
    assert [e["phase"] for e in errors] == ["agent"], errors
    assert "agent: " in result.stdout and "rollout: " not in result.stdout


async def test_a_call_that_never_reached_the_bridge_is_not_labelled_bridge(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    _setup(workspace, ["chat", "hello"], timeout=60)
    result = await run_cli(
        [
            *("eval", "run", "ws/configs/eval/probe.toml", "--name", "far", "--yes"),
            *("--advertise-url", "http://127.0.0.1:9", "--listener-port", str(_free_port())),
        ],
        cwd=tmp_path,
        env=env,
    )
    errors = _errors(workspace, "far")
    assert [e["phase"] for e in errors] == ["network"], errors
    assert "network: ConnectError: could not connect to the chat endpoint http://127.0.0.1:9/" in (
        result.stdout
    )

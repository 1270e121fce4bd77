"""Evals whose rollouts use the official SDKs through the bridge: one calls the Responses API
with ``openai``, one the Messages API with ``anthropic``, both passed through natively to a fake
provider (tests/fakes/api_upstream.py). Each rollout's tokens in ``index.jsonl`` are what the
provider reported, cached tokens included, and no provider key reaches a rollout."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import trio

from tests.fakes.api_upstream import ApiUpstream, run_api_upstream
from tests.launcher.e2e.helpers import REPO, UV, base_env, run_cli, run_dir, write_config

pytestmark = pytest.mark.slow

OPENAI_KEY = "sk-provider-key-for-sdk-rollouts-0000"
ANTHROPIC_KEY = "sk-ant-provider-key-000000000000"  # what the fake accepts

MAIN = '''
"""Reply through the official SDK named by SDK_API; fail if a provider key is visible."""

import os

import trio

from rollout_server import (
    AgentWorkflow, AgentWorkflowOutput, Grader, LocalBackend, get_rollout_context, serve,
)

KEYS = ("@OPENAI_KEY@", "@ANTHROPIC_KEY@")


def call(url, key, text):
    if os.environ["SDK_API"] == "responses":
        import openai

        client = openai.OpenAI(base_url=url, api_key=key, max_retries=0)
        with client.responses.stream(model="placeholder", input=text) as stream:
            return stream.get_final_response().output_text
    import anthropic

    client = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)
    messages = [{"role": "user", "content": text}]
    with client.messages.stream(model="placeholder", max_tokens=64, messages=messages) as stream:
        return stream.get_final_message().content[0].text


class Workflow(AgentWorkflow):
    async def run(self, ctx):
        leaked = [name for name, value in os.environ.items() if value in KEYS]
        if leaked:
            raise RuntimeError("a provider key reached the rollout: " + ", ".join(leaked))
        rc = get_rollout_context()
        text = str(ctx.prompt[-1]["content"])
        reply = await trio.to_thread.run_sync(call, rc.chat_completions_url, rc.api_key, text)
        return AgentWorkflowOutput(messages=[*ctx.prompt, {"role": "assistant", "content": reply}])


class Graded(Grader):
    async def grade(self, ctx):
        reply = ctx.sample.messages[-1]["content"]
        ctx.set_reward(1.0 if reply.startswith("native: ") else 0.0)


if __name__ == "__main__":
    serve(LocalBackend(workflow=Workflow, grader=Graded))
'''.replace("@OPENAI_KEY@", OPENAI_KEY).replace("@ANTHROPIC_KEY@", ANTHROPIC_KEY)

PYPROJECT = f"""
[project]
name = "sdk-rollout"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = ["rollbridge", "openai>=3.57,<4", "anthropic>=2.15,<3"]

[tool.uv]
package = false

[tool.uv.sources]
rollbridge = {{ path = "{REPO}", editable = true }}
"""


@pytest.fixture(scope="module")
def sdk_workspace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A workspace with the ``sdk`` rollout, and its synced environment."""
    root = tmp_path_factory.mktemp("sdk-rollout")
    ws = root / "ws"
    shutil.copytree(
        REPO / "examples" / "workspace",
        ws,
        ignore=shutil.ignore_patterns(".venv", "uv.lock", ".osmosis", "__pycache__"),
    )
    rollout = ws / "rollouts" / "sdk"
    rollout.mkdir()
    (rollout / "main.py").write_text(MAIN)
    (rollout / "pyproject.toml").write_text(PYPROJECT)
    venv = root / "venv"
    try:
        subprocess.run(
            [str(UV), "sync", "--project", str(rollout)],
            env=base_env(UV_PROJECT_ENVIRONMENT=str(venv)),
            check=True,
            capture_output=True,
            timeout=300,
        )
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"needs openai and anthropic from PyPI or uv's cache: {exc.stderr[-300:]!r}")
    return ws, venv


def _config(model: str, api: str, bridge: str) -> str:
    return (
        "[experiment]\n"
        f'rollout = "sdk"\nentrypoint = "main.py"\nmodel_path = "{model}"\n'
        'dataset = "echo.jsonl"\n\n'
        "[evaluation]\nbatch_size = 2\nagent_workflow_timeout_s = 60\ngrader_timeout_s = 30\n\n"
        f'[env]\nSDK_API = "{api}"\n\n[secrets]\nrequired = []\n\n[bridge]\n{bridge}\n'
    )


@pytest.mark.parametrize(
    ("model", "api", "bridge", "tokens"),
    [
        # The fake's Responses usage: 100 input (40 cached) + 7 output.
        ("openai/fake-model", "responses", 'responses = "native"', 107),
        # Anthropic's: 10 input + 60 cache read + 30 cache write, 5 output (a running total).
        ("anthropic/claude-fake", "messages", 'messages = "native"', 105),
    ],
)
async def test_sdk_rollout_tokens_reach_the_index(
    sdk_workspace: tuple[Path, Path],
    tmp_path: Path,
    nursery: trio.Nursery,
    model: str,
    api: str,
    bridge: str,
    tokens: int,
) -> None:
    ws, venv = sdk_workspace
    fake: ApiUpstream = await nursery.start(run_api_upstream, ApiUpstream())
    write_config(ws, api, _config(model, api, bridge))
    env = base_env(
        UV_PROJECT_ENVIRONMENT=str(venv),
        OPENAI_BASE_URL=fake.v1,
        OPENAI_API_KEY=OPENAI_KEY,
        ANTHROPIC_API_BASE=fake.base_url,
        ANTHROPIC_API_KEY=ANTHROPIC_KEY,
    )
    result = await run_cli(
        ["eval", "run", f"ws/configs/eval/{api}.toml", "--name", api, "--rows", "0-2", "--yes"],
        cwd=ws.parent,
        env=env,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr + result.stdout
    rows = [
        json.loads(line) for line in (run_dir(ws, api) / "index.jsonl").read_text().splitlines()
    ]
    assert len(rows) == 3
    assert all(r["status"] == "success" and r["reward"] == 1.0 for r in rows), rows
    assert [r["tokens"] for r in rows] == [tokens] * 3
    assert all(r["max_context_tokens"] == tokens for r in rows)
    # Neither provider key is written anywhere in the run directory or printed.
    run = run_dir(ws, api)
    written = [p.read_text(errors="replace") for p in run.rglob("*") if p.is_file()]
    for text in [*written, result.stdout, result.stderr]:
        assert OPENAI_KEY not in text and ANTHROPIC_KEY not in text
    served = [r for r in fake.requests if not r.path.endswith("/chat/completions")]
    assert len(served) >= 3 and all(
        r.body["model"] in ("fake-model", "claude-fake") for r in served
    )
    # One call record per call the provider served, named for its API, and the tokens
    # are the rows' (issue 24's record on the Responses and Messages routes too).
    records = [json.loads(line) for line in (run / "calls.jsonl").read_text().splitlines()]
    assert len(records) == len(fake.requests)  # the rollouts' calls and the preflight's
    routed = [r for r in records if r["kind"] == "rollout"]
    assert {r["api"] for r in routed} == {api}
    assert sum(r["total_tokens"] for r in routed) == sum(r["tokens"] for r in rows)
    assert all(r.get("cached_tokens") for r in routed)
    # The cache kinds reach the rows and the run's totals: each row's sums over its calls.
    for row in rows:
        mine = [r for r in routed if r["rollout_id"] == row["rollout_id"]]
        for key in ("cached_tokens", "cache_write_tokens"):
            assert row.get(key) == (sum(r[key] for r in mine) if key in mine[0] else None)
    metrics = json.loads((run / "metrics.json").read_text())["summary"]
    assert metrics["cached_tokens"] == sum(r["cached_tokens"] for r in rows)
    if api == "messages":
        assert [r["cache_write_tokens"] for r in rows] == [30] * 3
        assert metrics["cache_write_tokens"] == 90

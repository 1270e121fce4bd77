"""Echo rollout on osmosis-ai 0.3.8's SDK: one chat call with the row's messages, then grade.

Written for rollbridge's side-by-side benchmark (scripts/bench/reference_eval.py) against the
reference SDK's public API; the workspace builder copies it to ``rollouts/echo/main.py``.

The model is reached over HTTP at the per-rollout URL the reference supervisor hands out (its
model bridge), with the bearer it hands out. One HTTP client serves every rollout of the
process, as a rollout author would keep one.
"""

from __future__ import annotations

import os
from typing import Any

import httpx
import uvicorn
from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    AgentWorkflowOutput,
    Grader,
    GraderContext,
    LocalBackend,
    get_rollout_context,
)
from osmosis_ai.rollout.server import create_rollout_server

_client: httpx.AsyncClient | None = None


def _http() -> httpx.AsyncClient:
    global _client
    if _client is None:
        _client = httpx.AsyncClient(
            timeout=httpx.Timeout(600.0),
            # Idle connections are dropped well before the bridge's (uvicorn's) 5 s keep-alive
            # timeout, so a call never goes out on a connection the bridge is closing.
            limits=httpx.Limits(
                max_connections=None, max_keepalive_connections=1000, keepalive_expiry=2.0
            ),
        )
    return _client


class EchoWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext[Any]) -> AgentWorkflowOutput:
        rollout = get_rollout_context()
        assert rollout is not None, "no rollout context"
        messages = list(ctx.prompt)
        answer = await _http().post(
            rollout.chat_completions_url.rstrip("/") + "/chat/completions",
            json={"model": "bench", "messages": messages},
            headers={"Authorization": f"Bearer {rollout.api_key}"},
        )
        answer.raise_for_status()
        content = answer.json()["choices"][0]["message"].get("content") or ""
        return AgentWorkflowOutput(messages=[*messages, {"role": "assistant", "content": content}])


class EchoGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        replies = [m for m in ctx.sample.messages if m.get("role") == "assistant"]
        text = str(replies[-1].get("content") or "") if replies else ""
        label = (ctx.label or "").strip().lower()
        ctx.set_reward(1.0 if label and label in text.lower() else 0.0)


if __name__ == "__main__":
    # A workflow config with the default concurrency (no limit): without one, LocalBackend
    # admits 4 rollouts at a time and the supervisor caps its in-flight count to that.
    backend = LocalBackend(
        workflow=EchoWorkflow,
        workflow_config=AgentWorkflowConfig(name="echo"),
        grader=EchoGrader,
    )
    uvicorn.run(
        create_rollout_server(backend=backend),
        host="127.0.0.1",
        port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]),
        log_level="warning",
    )

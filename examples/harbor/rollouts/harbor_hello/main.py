"""Harbor rollout: every row is one Harbor trial of ``tasks/hello`` in a podman sandbox.

Template mode: the row's prompt becomes the task's instruction. The eval config picks the agent
through ``[env] HARBOR_AGENT``:

- ``oracle``, ``nop`` or ``terminus-2``: a Harbor agent on ``tasks/hello``, whose own tests grade.
- ``workflow``: :class:`EchoWorkflow` below runs *inside* the trial's container of
  ``workflow_tasks/echo`` (the rollout's bundle is baked into a sandbox image), and
  :class:`EchoGrader` grades it there at verification time, against the row's label (staged only
  with the tests; the task has no tests of its own). ``HARBOR_NETWORK=none`` gives the container
  no network at all: the exec relay carries its model calls.

``HARBOR_CONCURRENCY`` is the number of trials at once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import trio

from rollout_server import (
    AgentWorkflow,
    AgentWorkflowContext,
    AgentWorkflowOutput,
    Grader,
    GraderContext,
    chat,
    reply_text,
    serve,
)
from rollout_server.harbor import HarborBackend

#: Where ``tasks/`` and ``workflow_tasks/`` are: ``$HARBOR_EXAMPLE_DIR`` when set, else the example
#: directory this file is in. On another Ray node the rollout runs from a shipped copy of its own
#: directory alone (docs/scale-out.md), so a ``--ray`` run points this at the example on storage
#: every node shares.
WORKSPACE = Path(os.environ.get("HARBOR_EXAMPLE_DIR") or Path(__file__).resolve().parents[2])


def _openai_streamed_reply(messages: list[dict[str, Any]]) -> tuple[str, int]:
    """The official ``openai`` client, streaming: the joined deltas and how many carried text."""
    from openai import OpenAI  # only the workflow needs it (and it is slow to import)

    # The runner exports OPENAI_BASE_URL (the rollout's URL) and OPENAI_API_KEY (its bearer).
    client = OpenAI(max_retries=0, timeout=120)
    pieces: list[str] = []
    try:
        stream = client.chat.completions.create(
            model="osmosis-rollout", messages=messages, stream=True
        )
        for chunk in stream:
            for choice in chunk.choices:
                if choice.delta.content:
                    pieces.append(choice.delta.content)
    finally:
        client.close()
    return "".join(pieces), len(pieces)


class EchoWorkflow(AgentWorkflow[Any]):
    """Two model calls with the row's messages: one through the SDK's ``chat`` helper, one
    streamed through the official ``openai`` client (``streamed_chunks``: how many of its chunks
    carried text; the echo model sends one per word). Rows whose metadata says ``explode``
    fail."""

    async def run(self, ctx: AgentWorkflowContext[Any]) -> AgentWorkflowOutput:
        if ctx.metadata and ctx.metadata.get("explode"):
            raise ValueError("this row is designed to fail in the sandbox")
        messages = list(ctx.prompt)
        first = reply_text(await chat(messages))
        second, chunks = await trio.to_thread.run_sync(_openai_streamed_reply, messages)
        return AgentWorkflowOutput(
            messages=[*messages, {"role": "assistant", "content": first}],
            metrics={
                "clients_agree": 1.0 if first == second else 0.0,
                "streamed_chunks": float(chunks),
            },
        )


class EchoGrader(Grader):
    """Reward 1.0 when the label appears in the last reply, else 0.0."""

    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        replies = [m for m in ctx.sample.messages if m.get("role") == "assistant"]
        text = str(replies[-1].get("content") or "") if replies else ""
        label = (ctx.label or "").strip().lower()
        ctx.set_reward(1.0 if label and label in text.lower() else 0.0)


def make_backend() -> HarborBackend:
    """The backend the eval config's ``[env]`` asks for."""
    agent = os.environ.get("HARBOR_AGENT", "oracle")
    concurrency = int(os.environ.get("HARBOR_CONCURRENCY", "2"))
    if agent == "workflow":
        return HarborBackend(
            WORKSPACE / "workflow_tasks" / "echo",
            environment_type="podman",
            workflow=EchoWorkflow,
            grader=EchoGrader,
            sandbox_network=os.environ.get("HARBOR_NETWORK", "auto"),
            concurrency=concurrency,
        )
    return HarborBackend(
        WORKSPACE / "tasks" / "hello",
        mode="template",
        environment_type="podman",
        agent=agent,
        # terminus-2 calls the model as "openai/<name>" on the bridge; the bridge routes it to the
        # config's model_path, so the name here is only a label.
        model_name="openai/rollbridge" if agent.startswith("terminus") else None,
        concurrency=concurrency,
        cleanup_successful_trials=True,
    )


if __name__ == "__main__":
    serve(make_backend())

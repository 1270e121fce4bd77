"""Echo rollout: ask the model to repeat the prompt, then grade the reply against the label.

With ``model_path = "rollbridge/echo"`` the model is the bridge's built-in offline echo, so the
rows whose label is in the prompt pass and the others fail: a run shows both outcomes without
any API key. Point ``model_path`` at a real model and the same rollout works unchanged.
"""

from __future__ import annotations

from typing import Any

from rollout_server import (
    AgentWorkflow,
    AgentWorkflowContext,
    AgentWorkflowOutput,
    Grader,
    GraderContext,
    LocalBackend,
    chat,
    reply_text,
    serve,
)


class EchoWorkflow(AgentWorkflow):
    """One model call with the row's messages; the conversation becomes the sample."""

    async def run(self, ctx: AgentWorkflowContext[Any]) -> AgentWorkflowOutput:
        messages = list(ctx.prompt)
        response = await chat(messages)
        reply = {"role": "assistant", "content": reply_text(response)}
        return AgentWorkflowOutput(messages=[*messages, reply])


class EchoGrader(Grader):
    """Reward 1.0 when the label appears in the model's last reply, else 0.0.

    Rows whose metadata says ``skip`` are removed from scoring (they count as skipped); rows
    whose metadata says ``explode`` make the grader fail (they count as failed), so the example
    shows every outcome.
    """

    async def grade(self, ctx: GraderContext) -> None:
        if ctx.metadata and ctx.metadata.get("explode"):
            raise ValueError("this row is designed to fail grading")
        if ctx.metadata and ctx.metadata.get("skip"):
            assert ctx.sample is not None
            ctx.sample.remove_sample = True
            return
        assert ctx.sample is not None
        replies = [m for m in ctx.sample.messages if m.get("role") == "assistant"]
        text = str(replies[-1].get("content") or "") if replies else ""
        label = (ctx.label or "").strip().lower()
        ctx.set_reward(1.0 if label and label in text.lower() else 0.0)


if __name__ == "__main__":
    serve(LocalBackend(workflow=EchoWorkflow, grader=EchoGrader))

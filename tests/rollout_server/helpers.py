"""Workflows, graders and a server starter shared by the rollout_server tests.

Behaviour is steered per rollout through ``metadata`` so one server serves many cases:
``sleep`` (seconds in the workflow), ``gate`` (wait for ``GATES[name]``), ``raise`` (exception
class name raised by the workflow), ``return`` (``"none"``, ``"bad"``, ``"nomessages"``),
``reward`` (set by the grader), ``remove`` (grader marks the sample removed), ``grader_sleep``,
``grader_raise``, ``exit`` and ``grader_exit`` (``sys.exit`` with that code), ``metrics`` (returned as workflow metrics), ``bad_metrics`` (non-JSON values).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import trio

from rollout_server import (
    AgentWorkflow,
    AgentWorkflowContext,
    AgentWorkflowOutput,
    Grader,
    GraderContext,
    LocalBackend,
    RunningServer,
    get_rollout_context,
    serve_async,
)
from rollout_server.client import RolloutClient
from rollout_server.protocol import RolloutInitRequest

GATES: dict[str, trio.Event] = {}
STARTED: dict[str, trio.Event] = {}
CANCELLED: list[str] = []


def gate(name: str) -> trio.Event:
    return GATES.setdefault(name, trio.Event())


def started(name: str) -> trio.Event:
    return STARTED.setdefault(name, trio.Event())


class ScriptedWorkflow(AgentWorkflow[Any]):
    async def run(self, ctx: AgentWorkflowContext[Any]) -> Any:
        meta = ctx.metadata or {}
        rollout = get_rollout_context()
        assert rollout is not None
        started(rollout.rollout_id).set()
        try:
            if "sleep" in meta:
                await trio.sleep(meta["sleep"])
            if "gate" in meta:
                await gate(meta["gate"]).wait()
        except trio.Cancelled:
            CANCELLED.append(rollout.rollout_id)
            raise
        if "exit" in meta:
            sys.exit(meta["exit"])
        if "raise" in meta:
            raise {
                "ValueError": ValueError,
                "RuntimeError": RuntimeError,
                "TimeoutError": TimeoutError,
            }[meta["raise"]]("workflow says no")
        kind = meta.get("return")
        messages = [*ctx.prompt, {"role": "assistant", "content": "hello"}]
        if kind == "none":
            return None
        if kind == "bad":
            return 42
        if kind == "list":
            return messages
        if kind == "nomessages":
            return AgentWorkflowOutput(messages=None)
        if kind == "nan_message":
            return [{"role": "assistant", "content": "x", "weird": math.nan}]
        if ctx.artifacts_dir is not None:
            (ctx.artifacts_dir / "note.txt").write_text("made by the workflow")
        output = AgentWorkflowOutput(messages=messages, metrics=meta.get("metrics", {}))
        return output


class ScriptedGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        meta = ctx.metadata or {}
        if "grader_sleep" in meta:
            await trio.sleep(meta["grader_sleep"])
        if "grader_raise" in meta:
            raise RuntimeError("grader says no")
        if "grader_exit" in meta:
            sys.exit(meta["grader_exit"])
        assert ctx.sample is not None
        if meta.get("bad_metrics"):
            ctx.sample.metrics.update({"nan": math.nan, 1: "one", (1, 2): "tuple", "ok": 2})
            ctx.sample.extra_fields.update({"obj": object(), "inf": math.inf, "fine": "yes"})
        if meta.get("remove"):
            ctx.sample.remove_sample = True
        if meta.get("no_reward"):
            return
        reward = meta.get("reward", 1.0 if ctx.label == "L" else 0.0)
        ctx.set_reward(reward)


def backend(**kwargs: Any) -> LocalBackend:
    kwargs.setdefault("max_concurrent", 8)
    return LocalBackend(ScriptedWorkflow, ScriptedGrader, **kwargs)


async def start(
    nursery: trio.Nursery, tmp_path: Path, the_backend: Any = None, **options: Any
) -> tuple[RunningServer, RolloutClient]:
    """A real server on 127.0.0.1:0 plus a client for it (closed with the nursery)."""
    options.setdefault("artifact_root", tmp_path / "trials")
    options.setdefault("instance_id", "test-instance")
    running: RunningServer = await nursery.start(
        lambda task_status: serve_async(
            the_backend or backend(), port=0, task_status=task_status, **options
        )
    )
    client = RolloutClient(running.url, api_key=options.get("api_key"))
    return running, client


def request(rollout_id: str, **fields: Any) -> RolloutInitRequest:
    fields.setdefault("initial_messages", [{"role": "user", "content": "hi"}])
    fields.setdefault("chat_completions_url", "http://127.0.0.1:9/v1/rollouts/" + rollout_id)
    return RolloutInitRequest(rollout_id=rollout_id, **fields)

"""rollbridge's rollout SDK and long-poll rollout server.

Rollout authors import everything from here::

    from rollout_server import AgentWorkflow, Grader, LocalBackend, chat, serve

See ``docs/rollout-sdk.md``. The wire types live in :mod:`rollout_server.protocol` (msgspec
only) and the async protocol client in :mod:`rollout_server.client`. Names are imported lazily,
so ``import rollout_server.protocol`` does not pull in the HTTP server.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .backend import (
        ExecutionBackend,
        ExecutionOutcome,
        ExecutionRequest,
        ExecutionResult,
        categorize_exception,
    )
    from .chat import ChatError, chat, reply_text
    from .local import LocalBackend
    from .protocol import RolloutErrorCategory, RolloutStatus
    from .sdk import (
        AgentWorkflow,
        AgentWorkflowContext,
        AgentWorkflowOutput,
        Grader,
        GraderContext,
        RolloutContext,
        RolloutSample,
        SampleSource,
        get_rollout_context,
    )
    from .server import RunningServer, create_app, serve, serve_async
    from .service import RolloutService

_EXPORTS = {
    "ExecutionBackend": "backend",
    "ExecutionOutcome": "backend",
    "ExecutionRequest": "backend",
    "ExecutionResult": "backend",
    "categorize_exception": "backend",
    "ChatError": "chat",
    "chat": "chat",
    "reply_text": "chat",
    "LocalBackend": "local",
    "RolloutErrorCategory": "protocol",
    "RolloutStatus": "protocol",
    "AgentWorkflow": "sdk",
    "AgentWorkflowContext": "sdk",
    "AgentWorkflowOutput": "sdk",
    "Grader": "sdk",
    "GraderContext": "sdk",
    "RolloutContext": "sdk",
    "RolloutSample": "sdk",
    "SampleSource": "sdk",
    "get_rollout_context": "sdk",
    "RunningServer": "server",
    "create_app": "server",
    "serve": "server",
    "serve_async": "server",
    "RolloutService": "service",
}

__all__ = [
    "AgentWorkflow",
    "AgentWorkflowContext",
    "AgentWorkflowOutput",
    "ChatError",
    "ExecutionBackend",
    "ExecutionOutcome",
    "ExecutionRequest",
    "ExecutionResult",
    "Grader",
    "GraderContext",
    "LocalBackend",
    "RolloutContext",
    "RolloutErrorCategory",
    "RolloutSample",
    "RolloutService",
    "RolloutStatus",
    "RunningServer",
    "SampleSource",
    "categorize_exception",
    "chat",
    "create_app",
    "get_rollout_context",
    "reply_text",
    "serve",
    "serve_async",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rollout_server' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


class _Package(types.ModuleType):
    """``rollout_server.chat`` names both a submodule and the function it defines, which is what
    the package exports. Importing the submodule (``from rollout_server.chat import ChatError``)
    would make the import system set the package's ``chat`` to the module, so that a later
    ``from rollout_server import chat`` got a module; this keeps the function there instead."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "chat" and isinstance(value, types.ModuleType):
            value = value.chat
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

"""rollbridge's rollout SDK and long-poll rollout server.

Rollout authors import everything from here::

    from rollout_server import AgentWorkflow, Grader, LocalBackend, serve, chat

See ``docs/rollout-sdk.md``. The wire types live in :mod:`rollout_server.protocol` and the async
protocol client in :mod:`rollout_server.client`.
"""

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

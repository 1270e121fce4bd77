"""What a rollout author writes against: workflows, graders, their contexts, samples.

A rollout is an :class:`AgentWorkflow` (drives the model, returns the conversation) and,
optionally, a :class:`Grader` (scores it). The server sets an ambient :class:`RolloutContext`
for every rollout; :func:`get_rollout_context` returns it inside workflow and grader code.
"""

from __future__ import annotations

import abc
import contextvars
import copy
import math
import os
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .protocol import (
    ENV_API_KEY,
    ENV_CHAT_COMPLETIONS_URL,
    ENV_ROLLOUT_ID,
    RolloutStatus,
)

if TYPE_CHECKING:
    import httpx

__all__ = [
    "AgentWorkflow",
    "AgentWorkflowContext",
    "AgentWorkflowOutput",
    "Grader",
    "GraderContext",
    "RolloutContext",
    "RolloutSample",
    "SampleSource",
    "get_rollout_context",
]

TConfig = TypeVar("TConfig")


def _finite_reward(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("reward must be a number, not a bool")
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"reward must be a finite number, got {value!r}") from exc
    if not math.isfinite(number):
        raise ValueError(f"reward must be a finite number, got {value!r}")
    return number


_ATOMS = (str, int, float, bool, type(None))


def _plain_copy(value: Any, seen: set[int]) -> Any:
    """A copy of JSON-shaped ``value`` (dicts and lists with str keys and atoms, no container
    reached twice); ``TypeError`` on anything else."""
    kind = type(value)
    if kind is dict or kind is list:
        if id(value) in seen:
            raise TypeError  # shared or cyclic: deepcopy keeps the sharing
        seen.add(id(value))
        if kind is list:
            return [item if type(item) in _ATOMS else _plain_copy(item, seen) for item in value]
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                raise TypeError
            out[key] = item if type(item) in _ATOMS else _plain_copy(item, seen)
        return out
    if kind in _ATOMS:
        return value
    raise TypeError


def _copy_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``copy.deepcopy(messages)``, several times faster for the usual plain-JSON messages;
    anything else (other types, a container reached twice) takes ``deepcopy`` itself."""
    try:
        copied: list[dict[str, Any]] = _plain_copy(messages, set())
    except (TypeError, RecursionError):
        return copy.deepcopy(messages)
    return copied


class RolloutSample:
    """One rollout's sample: the conversation, its label, reward and metrics.

    ``reward`` only accepts finite numbers (ints and numeric strings are converted to float).
    ``trajectory_messages`` is what ``trajectory.json`` is built from; it defaults to a copy
    of ``messages`` and setting it to ``None`` disables the trajectory file. It never goes
    on the wire (:func:`rollout_server.jsonsafe.wire_sample` builds the wire form).
    """

    __slots__ = (
        "_reward",
        "extra_fields",
        "label",
        "messages",
        "metrics",
        "remove_sample",
        "trajectory_messages",
    )

    _UNSET: Any = object()

    def __init__(
        self,
        messages: list[dict[str, Any]] | None = None,
        *,
        label: str | None = None,
        reward: float | None = None,
        remove_sample: bool = False,
        metrics: dict[str, Any] | None = None,
        extra_fields: dict[str, Any] | None = None,
        trajectory_messages: list[dict[str, Any]] | None = _UNSET,
    ) -> None:
        self.messages: list[dict[str, Any]] = list(messages) if messages is not None else []
        self.label = label
        self._reward = _finite_reward(reward)
        self.remove_sample = bool(remove_sample)
        self.metrics: dict[str, Any] = dict(metrics) if metrics else {}
        self.extra_fields: dict[str, Any] = dict(extra_fields) if extra_fields else {}
        self.trajectory_messages: list[dict[str, Any]] | None = (
            _copy_messages(self.messages)
            if trajectory_messages is RolloutSample._UNSET
            else trajectory_messages
        )

    @property
    def reward(self) -> float | None:
        """The grader's score (finite float) or ``None``."""
        return self._reward

    @reward.setter
    def reward(self, value: float | None) -> None:
        self._reward = _finite_reward(value)

    def __repr__(self) -> str:
        return (
            f"RolloutSample(messages=<{len(self.messages)}>, label={self.label!r}, "
            f"reward={self._reward!r}, remove_sample={self.remove_sample!r})"
        )


@dataclass
class AgentWorkflowOutput:
    """What :meth:`AgentWorkflow.run` may return.

    ``messages`` becomes the sample's conversation (``None`` means no sample); ``metrics`` must
    map names to finite numbers; ``info`` is for the workflow's own use and is not passed on.
    """

    messages: list[dict[str, Any]] | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.messages is not None and not isinstance(self.messages, list):
            raise TypeError("AgentWorkflowOutput.messages must be a list of message dicts")
        for name, value in self.metrics.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"metric {name!r} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"metric {name!r} must be finite, got {value!r}")


@dataclass
class AgentWorkflowContext(Generic[TConfig]):
    """What a workflow sees: the prompt, its config, metadata and a directory for artifacts.

    There is deliberately no label: the workflow must not see the answer.
    """

    prompt: list[dict[str, Any]]
    config: TConfig | None = None
    metadata: dict[str, Any] | None = None
    artifacts_dir: Path | None = None


@dataclass
class GraderContext:
    """What a grader sees. Call :meth:`set_reward`, or set ``sample.remove_sample = True``."""

    label: str | None
    sample: RolloutSample | None
    metadata: dict[str, Any] | None = None
    artifacts_dir: Path | None = None
    project_path: str | None = None

    def set_reward(self, reward: float) -> None:
        """Set the sample's reward (finite number). Raises ``ValueError`` without a sample."""
        if self.sample is None:
            raise ValueError("GraderContext has no sample to reward")
        self.sample.reward = reward


class AgentWorkflow(abc.ABC, Generic[TConfig]):
    """Subclass this and implement :meth:`run`. One instance is created per rollout."""

    def __init__(self, config: TConfig | None = None) -> None:
        self.config = config

    @abc.abstractmethod
    async def run(
        self, ctx: AgentWorkflowContext[TConfig]
    ) -> AgentWorkflowOutput | list[dict[str, Any]] | None:
        """Drive the model; return the conversation (or ``None`` to use the sample source)."""


class Grader(abc.ABC):
    """Subclass this and implement :meth:`grade`. One instance is created per rollout."""

    def __init__(self, config: Any | None = None) -> None:
        self.config = config

    @abc.abstractmethod
    async def grade(self, ctx: GraderContext) -> Any:
        """Score ``ctx.sample`` with ``ctx.set_reward(...)``. The return value is ignored."""


class SampleSource(abc.ABC):
    """Supplies the sample when a workflow returns ``None`` (agent-framework integrations)."""

    @abc.abstractmethod
    async def get_sample(self) -> RolloutSample:
        """The rollout's one sample."""

    async def get_preview(self, max_messages: int) -> RolloutSample | None:
        """A partial sample for live previews; ``None`` when not supported."""
        return None


#: Clients :func:`rollout_server.chat.chat` may bypass for loopback calls (:func:`shared_client`).
_SHARED_CLIENTS: weakref.WeakSet[httpx.AsyncClient] = weakref.WeakSet()


def shared_client(client: httpx.AsyncClient) -> httpx.AsyncClient:
    """Mark ``client`` as a server's default client (the ``http_client`` of every rollout's
    context): ``chat()`` may then reach a loopback endpoint without it. Returns ``client``."""
    _SHARED_CLIENTS.add(client)
    return client


def is_shared_client(client: httpx.AsyncClient) -> bool:
    """Whether ``client`` was marked by :func:`shared_client`."""
    return client in _SHARED_CLIENTS


class _LazyClient:
    """``RolloutContext.http_client``: the client given, or else the one the context's
    ``http_client_factory`` returns, asked for at the first read.

    A server's shared client is only made when something reads it: building it imports httpx
    and loads the CA bundle (about 0.1 s of CPU), which a server whose rollouts only call
    :func:`~rollout_server.chat.chat` over its loopback path never needs.
    """

    def __get__(self, ctx: RolloutContext | None, owner: Any = None) -> httpx.AsyncClient | None:
        if ctx is None:
            return None  # the field's default (a dataclass reads it on the class)
        client: httpx.AsyncClient | None = ctx.__dict__["_http_client"]
        if client is None and ctx.http_client_factory is not None:
            client = ctx.__dict__["_http_client"] = ctx.http_client_factory()
        return client

    def __set__(self, ctx: RolloutContext, client: httpx.AsyncClient | None) -> None:
        ctx.__dict__["_http_client"] = client


@dataclass
class RolloutContext:
    """The ambient per-rollout context (see :func:`get_rollout_context`).

    ``chat_completions_url`` is the OpenAI-compatible base URL for this rollout (append
    ``/chat/completions``); ``api_key`` is the bearer for it. Both fall back to the
    ``OSMOSIS_CHAT_COMPLETIONS_URL`` / ``OSMOSIS_API_KEY`` environment variables when the
    request left them empty. ``http_client``, when not given, is made by
    ``http_client_factory`` (if any) the first time it is read.
    """

    chat_completions_url: str
    api_key: str | None
    rollout_id: str
    process_id: str | None = None
    http_client: _LazyClient = _LazyClient()
    sample_source: SampleSource | None = None
    status_callback: Callable[[RolloutStatus], Awaitable[None]] | None = None
    http_client_factory: Callable[[], httpx.AsyncClient] | None = None

    def __post_init__(self) -> None:
        if not self.chat_completions_url:
            self.chat_completions_url = os.environ.get(ENV_CHAT_COMPLETIONS_URL, "")
        if not self.api_key:
            self.api_key = os.environ.get(ENV_API_KEY) or None
        if not self.rollout_id:
            self.rollout_id = os.environ.get(ENV_ROLLOUT_ID, "")

    def set_sample_source(self, source: SampleSource) -> None:
        """Register the rollout's sample source; a second registration raises ``ValueError``."""
        if self.sample_source is not None:
            raise ValueError("a sample source is already registered for this rollout")
        self.sample_source = source

    async def get_sample(self) -> RolloutSample | None:
        """The registered sample source's sample, or ``None`` without a source."""
        if self.sample_source is None:
            return None
        return await self.sample_source.get_sample()

    async def set_status(self, status: RolloutStatus) -> None:
        """Report a progress transition (for example ``grading``) to pollers."""
        if self.status_callback is not None:
            await self.status_callback(RolloutStatus(status))


_current: contextvars.ContextVar[RolloutContext | None] = contextvars.ContextVar(
    "rollbridge_rollout_context", default=None
)


def given_http_client(ctx: RolloutContext) -> httpx.AsyncClient | None:
    """``ctx.http_client`` if it was given or already made; never makes one."""
    client: httpx.AsyncClient | None = ctx.__dict__["_http_client"]
    return client


def get_rollout_context() -> RolloutContext | None:
    """The active rollout's context, or ``None`` outside a rollout."""
    return _current.get()


def set_rollout_context(ctx: RolloutContext | None) -> contextvars.Token[RolloutContext | None]:
    """Install ``ctx`` as the ambient context of the current task (server internals)."""
    return _current.set(ctx)

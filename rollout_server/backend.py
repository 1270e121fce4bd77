"""The execution backend interface the server runs rollouts through."""

from __future__ import annotations

import abc
import importlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from .protocol import (
    CancelDisposition,
    RolloutErrorCategory,
    RolloutStatus,
    is_single_path_segment,
)
from .sdk import RolloutSample

__all__ = [
    "FAILURE_KEY",
    "ExecutionBackend",
    "ExecutionOutcome",
    "ExecutionRequest",
    "ExecutionResult",
    "categorize_exception",
    "describe_exception",
    "load_object",
]

FAILURE_KEY = "failure"
"""The ``extra_fields`` (``diagnostics.json``) key that says why a rollout failed: ``phase``
(``agent``, ``grader``, ``bridge``, ``network``, ``server``), ``type`` (the exception class), ``status`` (an
HTTP status) and ``message`` (only when it says more than ``err_message``). The wire result has
no room for these, and a client that does not read the file loses nothing."""
_BRIDGE_MESSAGE_LIMIT = 4096

_HTTP_ERROR_CLASSES = frozenset(
    {
        "SandboxConnectionException",
        "SandboxRateLimitException",
        "PoolStateStoreUnavailableException",
    }
)
_HTTP_STATUS_CLASSES = frozenset({"SandboxApiException", "SandboxAPIError"})
_HTTP_STATUSES = frozenset({401, 402, 403, 429, 500, 502, 503, 504})


def categorize_exception(exc: BaseException) -> RolloutErrorCategory:
    """The ``err_category`` for an exception raised by user or backend code."""
    for cls in type(exc).__mro__:
        if cls.__name__ in _HTTP_ERROR_CLASSES:
            return RolloutErrorCategory.HTTP_ERROR
        if cls.__name__ in _HTTP_STATUS_CLASSES:
            status = getattr(exc, "status_code", None)
            if isinstance(status, int) and status in _HTTP_STATUSES:
                return RolloutErrorCategory.HTTP_ERROR
    if isinstance(exc, TimeoutError | trio.TooSlowError):
        return RolloutErrorCategory.TIMEOUT
    if isinstance(exc, ValueError | TypeError | AssertionError):
        return RolloutErrorCategory.VALIDATION_ERROR
    return RolloutErrorCategory.AGENT_ERROR


def _bridge_error(body: str) -> tuple[str, int | None]:
    """The error text inside a bridge/provider error body (``{"error": {"message": …}}``, else
    the body itself) and the provider's own status when the bridge reports one
    (``upstream_status``: the rollout was answered 502 for a provider 5xx)."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return body[:_BRIDGE_MESSAGE_LIMIT], None
    error = doc.get("error") if isinstance(doc, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    upstream = error.get("upstream_status") if isinstance(error, dict) else None
    if not isinstance(upstream, int) or isinstance(upstream, bool):
        upstream = None
    return (message if isinstance(message, str) else body)[:_BRIDGE_MESSAGE_LIMIT], upstream


def _from_an_api(body: str) -> bool:
    """Whether an error answer's body is an API's JSON error (the bridge's, or any OpenAI-style
    endpoint's ``{"error": …}`` / ``{"detail": …}``), not a proxy's page."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and ("error" in doc or "detail" in doc)


def describe_exception(exc: BaseException, phase: str) -> dict[str, Any]:
    """The :data:`FAILURE_KEY` object for ``exc`` raised in ``phase``.

    A :class:`~rollout_server.chat.ChatError` whose body is an API's JSON error is the model
    endpoint (the bridge) answering an error: its phase becomes ``bridge``, with the status
    and the endpoint's own message. A model call that never reached the bridge is ``network``:
    no connection could be made to the chat URL, or something in front of it (a proxy or
    tunnel at the advertised URL) answered with a page of its own. Any other exception
    carrying an integer ``status_code`` (HTTP client errors) keeps that status.
    """
    detail: dict[str, Any] = {"phase": phase, "type": type(exc).__name__}
    unreached = getattr(exc, "rollbridge_unreached_url", None)
    if isinstance(unreached, str):
        message = f"could not connect to the chat endpoint {unreached}: {exc}"
        detail.update(phase="network", message=message[:_BRIDGE_MESSAGE_LIMIT])
        return detail
    # Looked up, not imported: importing the submodule here would shadow the lazily exported
    # ``rollout_server.chat`` function with the module (and a ChatError implies it is loaded).
    chat_error = getattr(sys.modules.get(f"{__package__}.chat"), "ChatError", None)
    if chat_error is not None and isinstance(exc, chat_error):
        detail.update(_answered(exc.status_code, exc.body))
        return detail
    client = _official_client_error(exc)
    if client is not None:
        detail.update(client)
        return detail
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and not isinstance(status, bool):
        detail["status"] = status
    return detail


def _answered(status: int, body: str) -> dict[str, Any]:
    """Where a model call answered ``status`` with ``body`` failed: an API's JSON error is the
    endpoint (the bridge) answering, ``bridge``, with the provider's status when the bridge
    names one; any other body is something in front of it (a proxy or tunnel at the advertised
    URL whose origin is down), so the call never reached the bridge: ``network``."""
    if not _from_an_api(body):
        text = " ".join(body.split())[:300]
        message = f"HTTP {status} from in front of the chat endpoint: {text}"
        return {"phase": "network", "status": status, "message": message}
    message, upstream = _bridge_error(body)
    found: dict[str, Any] = {"phase": "bridge", "status": upstream or status, "message": message}
    if upstream is not None:
        found["bridge_status"] = status
    return found


def _official_client_error(exc: BaseException) -> dict[str, Any] | None:
    """The phase, status and message of an error the official ``openai`` or ``anthropic``
    client raised on a model call (recognised by name: neither is a dependency of the SDK), as
    for a :class:`~rollout_server.chat.ChatError`: the endpoint's JSON error is ``bridge``,
    no connection or a page of something in front of it is ``network``. A client timeout
    stays where it was raised (the call took too long; nothing answered an error)."""
    kind = type(exc)
    if kind.__module__.partition(".")[0] not in ("openai", "anthropic"):
        return None
    names = {base.__name__ for base in kind.__mro__}
    if "APITimeoutError" in names:
        return None
    if "APIConnectionError" in names:
        message = f"could not connect to the chat endpoint: {exc}"
        return {"phase": "network", "message": message[:_BRIDGE_MESSAGE_LIMIT]}
    status = getattr(exc, "status_code", None)
    response = getattr(exc, "response", None)
    if isinstance(status, int) and not isinstance(status, bool) and response is not None:
        try:
            body = str(response.text)
        except Exception:  # a streamed answer not read: only the client's own message
            body = json.dumps({"error": {"message": str(exc)}})
        return _answered(status, body)
    if "APIError" in names:
        # An error event in a stream: the endpoint's own, with no HTTP status of its own.
        return {"phase": "bridge", "message": str(exc)[:_BRIDGE_MESSAGE_LIMIT]}
    return None


@dataclass
class ExecutionRequest:
    """One admitted rollout, as handed to :meth:`ExecutionBackend.execute`."""

    id: str
    prompt: list[dict[str, Any]]
    label: str | None = None
    metadata: dict[str, Any] | None = None
    agent_timeout_sec: float | None = None
    grader_timeout_sec: float | None = None
    grade: bool = True
    rollout_dir: Path | None = None
    """``<artifact root>/<id>``: where the backend keeps this rollout's files."""

    def __post_init__(self) -> None:
        if not is_single_path_segment(self.id):
            raise ValueError("rollout id must be a single path segment")


@dataclass
class ExecutionResult:
    """The result of one phase (workflow or grader).

    ``extra_fields`` are backend diagnostics: written to ``diagnostics.json``, never sent.
    """

    status: RolloutStatus
    sample: RolloutSample | None = None
    err_message: str | None = None
    err_category: RolloutErrorCategory | None = None
    extra_fields: dict[str, Any] | None = None


@dataclass
class ExecutionOutcome:
    """What :meth:`ExecutionBackend.execute` returns: the workflow result and, if it ran, the
    grader result."""

    workflow: ExecutionResult
    grader: ExecutionResult | None = None

    def reported(self) -> ExecutionResult:
        """The result reported to pollers (docs/spec/protocol.md §9.1)."""
        if self.workflow.status != RolloutStatus.SUCCESS:
            if self.workflow.sample is None and self.grader is not None and self.grader.sample:
                return ExecutionResult(
                    status=self.workflow.status,
                    sample=self.grader.sample,
                    err_message=self.workflow.err_message,
                    err_category=self.workflow.err_category,
                    extra_fields=self.workflow.extra_fields,
                )
            return self.workflow
        return self.grader if self.grader is not None else self.workflow

    def saved(self) -> ExecutionResult:
        """The result the trajectory is saved from: the grader's if it has a sample."""
        if self.grader is not None and self.grader.sample is not None:
            return self.grader
        return self.workflow

    def diagnostics(self) -> dict[str, Any] | None:
        """What ``diagnostics.json`` holds: the saved result's ``extra_fields``, plus the
        reported failure's reason (:data:`FAILURE_KEY`) when the two differ (a grader that
        failed without a sample after a successful workflow), so the reason is never lost."""
        saved, reported = self.saved(), self.reported()
        diagnostics = saved.extra_fields
        if reported is saved or reported.status != RolloutStatus.FAILURE:
            return diagnostics
        failure = (reported.extra_fields or {}).get(FAILURE_KEY)
        if failure is None or (diagnostics is not None and FAILURE_KEY in diagnostics):
            return diagnostics
        return {**(diagnostics or {}), FAILURE_KEY: failure}


class ExecutionBackend(abc.ABC):
    """Runs rollouts for the server. Subclass and implement :meth:`execute`.

    The server sets the ambient :class:`~rollout_server.RolloutContext` before calling
    :meth:`execute` and cancels the calling task to cancel a rollout (unless
    :meth:`cancel_rollouts` claims the rollout by returning a disposition for it).
    """

    @abc.abstractmethod
    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        """Run one rollout to its outcome."""

    def has_capacity(self) -> bool:
        """False makes admission answer 429 with ``Retry-After``."""
        return True

    def background_tasks(self) -> int:
        """Work the backend still does for rollouts whose result is already answered (a
        sandbox's teardown); ``/health`` counts it in ``lifecycle.active_rollouts``, and
        :meth:`shutdown` must wait for it."""
        return 0

    def rollout_status(self, rollout_id: str) -> dict[str, Any] | None:
        """The backend's own view of a rollout, if it tracks one (``{"status": ...}``)."""
        return None

    def cancel_rollouts(
        self, ids: list[str] | None = None, prefix: str | None = None, all: bool = False
    ) -> dict[str, CancelDisposition | str]:
        """Cancel rollouts the backend manages itself; ``{}`` lets the server cancel its task."""
        return {}

    def health(self) -> dict[str, Any]:
        """Fields merged into ``/health`` (capacity, ``chat_endpoint``, ...)."""
        return {"status": "ok"}

    async def probe_chat_endpoint(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """Find how this backend's sandboxes reach the bridge; None: no probe here (404).

        ``request`` is the validated body of ``POST /v1/rollbridge/probe-chat-endpoint``
        (``nonce``, ``expect``, ``candidates`` as ``[{kind, url}]``, ``exclusive``); the answer
        is the probe report's JSON. A backend that answers should also add
        ``"probe": "/v1/rollbridge/probe-chat-endpoint"`` to its ``chat_endpoint`` health.
        """
        return None

    async def shutdown(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Release backend resources when the server stops."""


def load_object(spec: str) -> Any:
    """The object a ``"module:Qualname"`` string names (dotted qualnames allowed)."""
    module_name, sep, qualname = spec.partition(":")
    if not sep or not module_name or not qualname:
        raise ValueError(f"expected 'module:Qualname', got {spec!r}")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj

"""A one-line model call for workflows: ``reply = await chat(messages)``.

It POSTs an OpenAI-compatible chat completion to ``<ctx.chat_completions_url>/chat/completions``
with ``Authorization: Bearer <ctx.api_key>``, where ``ctx`` is the current rollout's context, and
returns the parsed JSON response. Non-2xx answers raise :class:`ChatError`.

A call to a plain-HTTP loopback endpoint (the bridge of a local run) with the default timeouts,
made with the server's shared client or none, goes through a lean keep-alive HTTP/1.1 pool of
this trio run (:class:`~rollout_server.net.h1client.H1Pool`) instead of httpx: for a short
model call httpx's request and response machinery costs more CPU than the rest of the rollout.
Failures raise the same httpx exception types either way: that pool speaks the project's own
failure types (:mod:`rollout_server.net.wireerrors`), and ``chat()``, whose callers are
workflows written against httpx's (docs/rollout-sdk.md), turns them into httpx's here, at
the SDK's edge. Any other call (HTTPS, a remote host,
custom timeouts, a client a test or tool put in the context) goes through httpx as before.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .net.hosts import is_loopback_host
from .sdk import RolloutContext, get_rollout_context, given_http_client, is_shared_client

if TYPE_CHECKING:
    import httpx
    from trio.lowlevel import RunVar

    from .net.h1client import H1Pool
    from .net.wireerrors import WireError

__all__ = ["DEFAULT_MODEL", "UNREACHED_TYPES", "ChatError", "chat", "reply_text"]

#: Exception types (by name, to import nothing) of a call that never reached the endpoint:
#: no connection could be made. Such an exception gets ``rollbridge_unreached_url``.
UNREACHED_TYPES = frozenset({"ConnectError", "ConnectTimeout"})

DEFAULT_MODEL = "osmosis-rollout"
"""The model name sent when none is given; the bridge maps it to the configured model."""

_TIMEOUT_SEC = 600.0
_CONNECT_TIMEOUT_SEC = 10.0

#: The lean pools of each trio run, by ``(host, port)`` (made at the first call: importing
#: this module must not import trio).
_POOLS: RunVar[dict[tuple[str, int], H1Pool]] | None = None


@functools.lru_cache(maxsize=64)
def _lean_origin(netloc: str) -> tuple[str, int] | None:
    """``(host, port)`` when a plain-HTTP URL's authority ``netloc`` is a loopback host
    without credentials. Cached: a run's rollouts call URLs that differ only in their paths,
    and parsing the authority and the address is most of the cost of this routing."""
    parts = urlsplit(f"http://{netloc}")
    host = parts.hostname
    if host is None or parts.username or parts.password or not is_loopback_host(host):
        return None
    try:
        return host, parts.port or 80
    except ValueError:
        return None


def _lean_target(url: str) -> tuple[H1Pool, bytes] | None:
    """The pool and request target for ``url`` when it is plain HTTP to a loopback host."""
    if not url.startswith("http://"):
        return None
    parts = urlsplit(url)
    origin = _lean_origin(parts.netloc)
    if origin is None or parts.fragment:
        return None
    host, port = origin
    global _POOLS
    if _POOLS is None:
        from trio.lowlevel import RunVar

        _POOLS = RunVar("rollbridge_chat_pools")
    try:
        pools = _POOLS.get()
    except LookupError:
        pools = {}
        _POOLS.set(pools)
    pool = pools.get((host, port))
    if pool is None:
        from .net.h1client import H1Pool

        pool = pools[(host, port)] = H1Pool(host, port)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return pool, target.encode("ascii")


class ChatError(RuntimeError):
    """The chat endpoint answered with a non-2xx status (``status_code``, ``body``)."""

    def __init__(self, status_code: int, body: str, url: str):
        super().__init__(f"chat completion failed: HTTP {status_code} from {url}: {body[:500]}")
        self.status_code = status_code
        self.body = body


async def chat(
    messages: list[dict[str, Any]],
    *,
    ctx: RolloutContext | None = None,
    model: str = DEFAULT_MODEL,
    http_timeout: float | httpx.Timeout | None = None,
    **params: Any,
) -> dict[str, Any]:
    """Call the rollout's chat endpoint; ``params`` go into the request body as they are.

    Must run inside a rollout (or be given ``ctx``). ``http_timeout`` overrides the default
    (600 s total, 10 s connect). Returns the parsed response body.
    """
    ctx = ctx or get_rollout_context()
    if ctx is None:
        raise RuntimeError("chat() needs a rollout context: call it from a workflow or grader")
    if not ctx.chat_completions_url:
        raise RuntimeError("this rollout has no chat_completions_url")
    url = ctx.chat_completions_url.rstrip("/") + "/chat/completions"
    headers = {"Authorization": f"Bearer {ctx.api_key}"} if ctx.api_key else {}
    body = {"model": model, "messages": messages, **params}
    try:
        return await _post(ctx, url, body, headers, http_timeout)
    except Exception as exc:
        if not isinstance(exc, ChatError) and UNREACHED_TYPES & {
            t.__name__ for t in type(exc).__mro__
        }:
            # Tells describe_exception the call never reached the endpoint (see there).
            exc.rollbridge_unreached_url = url  # type: ignore[attr-defined]
        raise


async def _post(
    ctx: RolloutContext,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    http_timeout: float | httpx.Timeout | None,
) -> dict[str, Any]:
    # The context's own client, not one its factory would make for this read: that one is
    # the server's shared client, which the lean path bypasses anyway.
    given = given_http_client(ctx)
    lean = (
        _lean_target(url)
        if http_timeout is None and (given is None or is_shared_client(given))
        else None
    )
    if lean is not None:
        pool, target = lean
        content = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        head = [(b"content-type", b"application/json")]
        head += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        from .net.wireerrors import WireError

        try:
            reply = await pool.request(
                b"POST",
                target,
                head,
                content,
                total_sec=_TIMEOUT_SEC,
                connect_sec=_CONNECT_TIMEOUT_SEC,
            )
        except WireError as exc:
            raise _as_httpx(exc) from exc
        if not 200 <= reply.status < 300:
            raise ChatError(reply.status, reply.text(), url)
        answer: dict[str, Any] = reply.json()
        return answer
    # Imported here, not on the lean path: a server whose rollouts only take that path never
    # imports httpx (about 30 ms of CPU).
    import httpx

    request_timeout = (
        http_timeout
        if http_timeout is not None
        else httpx.Timeout(_TIMEOUT_SEC, connect=_CONNECT_TIMEOUT_SEC)
    )
    if ctx.http_client is not None:
        response = await ctx.http_client.post(
            url, json=body, headers=headers, timeout=request_timeout
        )
    else:
        async with httpx.AsyncClient(timeout=request_timeout) as client:
            response = await client.post(url, json=body, headers=headers)
    if not response.is_success:
        raise ChatError(response.status_code, response.text, url)
    # Returned as parsed: an OpenAI-compatible endpoint answers a JSON object.
    payload: dict[str, Any] = response.json()
    return payload


def _as_httpx(exc: WireError) -> httpx.TransportError:
    """httpx's exception for a failure of the lean pool; only a failure to connect becomes a
    connect error."""
    # Imported on failure only: a server whose rollouts only take the lean path never imports
    # httpx (about 30 ms of CPU).
    import httpx

    from .net.wireerrors import (
        ConnectFailed,
        ConnectTimeout,
        LocalFailure,
        ReadFailed,
        ReadTimeout,
        WriteFailed,
    )

    cause = exc.__cause__
    shown = (str(cause) or type(cause).__name__) if cause is not None else str(exc)
    if isinstance(exc, ConnectTimeout):
        return httpx.ConnectTimeout("timed out connecting")
    if isinstance(exc, ConnectFailed):
        return httpx.ConnectError(shown)
    if isinstance(exc, WriteFailed):
        return httpx.WriteError(shown)
    if isinstance(exc, ReadFailed):
        return httpx.ReadError(shown)
    if isinstance(exc, ReadTimeout):
        return httpx.ReadTimeout(shown)
    if isinstance(exc, LocalFailure):
        return httpx.LocalProtocolError(shown)
    return httpx.RemoteProtocolError(shown)


def reply_text(response: dict[str, Any]) -> str:
    """The first choice's message content ("" when absent)."""
    try:
        content = response["choices"][0]["message"].get("content")
    except (KeyError, IndexError, TypeError, AttributeError):
        return ""
    return content if isinstance(content, str) else ""

"""A one-line model call for workflows: ``reply = await chat(messages)``.

It POSTs an OpenAI-compatible chat completion to ``<ctx.chat_completions_url>/chat/completions``
with ``Authorization: Bearer <ctx.api_key>``, where ``ctx`` is the current rollout's context, and
returns the parsed JSON response. Non-2xx answers raise :class:`ChatError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .sdk import RolloutContext, get_rollout_context

if TYPE_CHECKING:
    import httpx

__all__ = ["DEFAULT_MODEL", "ChatError", "chat", "reply_text"]

DEFAULT_MODEL = "osmosis-rollout"
"""The model name sent when none is given; the bridge maps it to the configured model."""

_TIMEOUT_SEC = 600.0
_CONNECT_TIMEOUT_SEC = 10.0


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
    # Imported here: a rollout's main.py imports chat, and httpx is not needed before a call.
    import httpx

    ctx = ctx or get_rollout_context()
    if ctx is None:
        raise RuntimeError("chat() needs a rollout context: call it from a workflow or grader")
    if not ctx.chat_completions_url:
        raise RuntimeError("this rollout has no chat_completions_url")
    url = ctx.chat_completions_url.rstrip("/") + "/chat/completions"
    headers = {"Authorization": f"Bearer {ctx.api_key}"} if ctx.api_key else {}
    body = {"model": model, "messages": messages, **params}
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


def reply_text(response: dict[str, Any]) -> str:
    """The first choice's message content ("" when absent)."""
    try:
        content = response["choices"][0]["message"].get("content")
    except (KeyError, IndexError, TypeError, AttributeError):
        return ""
    return content if isinstance(content, str) else ""

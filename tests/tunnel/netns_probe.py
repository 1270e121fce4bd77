"""Run inside a network namespace: the rollout's model call, once per chat_completions_url.

Usage: python -m tests.tunnel.netns_probe <bearer> <rollout id> <chat_completions_url>...
Each call goes through the SDK's ``chat()`` with the context a rollout would get. Prints one JSON
list with ``{"url", "reply"}`` or ``{"url", "error"}`` per URL.
"""

from __future__ import annotations

import json
import sys

import httpx
import trio

from rollout_server.chat import ChatError, chat, reply_text
from rollout_server.sdk import RolloutContext


async def main(bearer: str, rollout_id: str, urls: list[str]) -> None:
    results: list[dict[str, str]] = []
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
        for url in urls:
            ctx = RolloutContext(
                chat_completions_url=url, api_key=bearer, rollout_id=rollout_id, http_client=client
            )
            messages = [{"role": "user", "content": "from the sandbox"}]
            try:
                response = await chat(messages, ctx=ctx)
            except (httpx.HTTPError, ChatError) as exc:
                results.append({"url": url, "error": f"{type(exc).__name__}: {exc}"})
                continue
            results.append({"url": url, "reply": reply_text(response)})
    print(json.dumps(results))


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], sys.argv[3:])

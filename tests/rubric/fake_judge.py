"""A fake LLM judge: the shared fake OpenAI-compatible upstream, answering judge prompts.

By default it scores 1.0 when the ground truth block of the prompt occurs in the candidate
block (case-insensitive) and 0.0 otherwise, so a judge over the example workspace's run gives
the same verdicts as the example's own grader. Tests replace ``script`` to give chosen replies
per judge model and candidate. Every answer reports ``usage`` of 10 prompt and 5 completion
tokens. With ``hold_after`` set, answers after that many wait until ``release`` is set.

Run it alone for the worked example of docs/rubric.md::

    python -m tests.rubric.fake_judge     # prints the OPENAI_BASE_URL to use
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from tests.fakes.upstream import FakeUpstream, _send_json, run_fake_upstream

USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
_BLOCK = re.compile(r"<<<BEGIN_(\w+)>>>\n(.*?)\n<<<END_\1>>>", re.DOTALL)

Script = Callable[[str, dict[str, str]], str]
"""``script(model, blocks) -> reply content``; ``blocks`` maps sentinel labels to their text."""


def blocks_of(request: dict[str, Any]) -> dict[str, str]:
    """The sentinel-quoted blocks of a judge request's user message."""
    messages = request.get("messages") or []
    user = next((m for m in messages if m.get("role") == "user"), {})
    return dict(_BLOCK.findall(str(user.get("content", ""))))


def contains_truth(_model: str, blocks: dict[str, str]) -> str:
    """1.0 when the ground truth occurs in the candidate, else 0.0."""
    truth = blocks.get("GROUND_TRUTH", "").strip().lower()
    found = bool(truth) and truth in blocks.get("CANDIDATE_OUTPUT", "").lower()
    explanation = "The reply contains the reference." if found else "The reference is missing."
    return json.dumps({"score": 1.0 if found else 0.0, "explanation": explanation})


@dataclass
class FakeJudge(FakeUpstream):
    """The fake upstream with judge replies (see the module docstring)."""

    script: Script = contains_truth
    hold_after: int | None = None
    release: trio.Event = field(default_factory=trio.Event)
    answered: int = 0

    async def _answer(self, request: dict[str, Any], send: Any) -> None:
        if self.fail_statuses:
            await super()._answer(request, send)
            return
        if self.hold_after is not None and self.answered >= self.hold_after:
            await self.release.wait()
        self.answered += 1
        model = str(request.get("model", ""))
        content = self.script(model, blocks_of(request))
        await _send_json(
            send,
            200,
            {
                "id": "chatcmpl-judge",
                "object": "chat.completion",
                "created": 1_700_000_000,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": dict(USAGE),
            },
        )


async def _main() -> None:
    async with trio.open_nursery() as nursery:
        judge: FakeJudge = await nursery.start(run_fake_upstream, FakeJudge())
        print(f"OPENAI_BASE_URL={judge.v1}", flush=True)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(_main)

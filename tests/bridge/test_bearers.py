"""Per-rollout bearers (bridge.bearers): a rollout's URL accepts only its own bearer, on every
API and on the door's routes, so no rollout id can be made up; the run's token keeps the
routes outside rollout URLs. Real bridge on port 0, the echo model."""

from __future__ import annotations

import httpx
import pytest
import trio

from bridge.bearers import PREFIX, Bearers, rollout_bearer
from bridge.scrub import ErrorScrubber
from tests.bridge.conftest import HI, TOKEN, StartBridge

CHAT = {"messages": HI}
RESP = {"model": "m", "input": "hi"}
MSG = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def test_a_bearer_is_derived_from_the_token_and_the_id() -> None:
    one = rollout_bearer("t", "r1")
    assert one.startswith(PREFIX) and len(one) == len(PREFIX) + 43
    assert (
        one == rollout_bearer("t", "r1") != rollout_bearer("t", "r2") != rollout_bearer("u", "r1")
    )
    bearers = Bearers("t", per_rollout=True)
    assert bearers.expected("/v1/rollouts/r1/chat/completions") == one
    assert bearers.expected("/v1/chat/completions") == "t"
    assert Bearers("t").expected("/v1/rollouts/r1/chat/completions") == "t"


def test_a_rollout_bearer_is_scrubbed_from_error_text() -> None:
    bearer = rollout_bearer(TOKEN, "r1")
    assert bearer not in ErrorScrubber([TOKEN]).scrub(f"echoed key {bearer} back")


@pytest.mark.parametrize(
    ("path", "body", "header"),
    [
        ("/chat/completions", CHAT, "authorization"),
        ("/responses", RESP, "authorization"),
        ("/v1/messages", MSG, "x-api-key"),
    ],
)
async def test_a_rollout_url_takes_only_its_own_bearer(
    start_bridge: StartBridge, path: str, body: dict[str, object], header: str
) -> None:
    handle = await start_bridge(model="rollbridge/echo", per_rollout_bearers=True)

    def auth(value: str) -> dict[str, str]:
        return {header: f"Bearer {value}" if header == "authorization" else value}

    own, other = rollout_bearer(TOKEN, "r1"), rollout_bearer(TOKEN, "r2")
    with trio.fail_after(20):
        async with httpx.AsyncClient(timeout=10) as client:
            url = handle.rollout_url("r1") + path
            answers = {
                name: (await client.post(url, json=body, headers=auth(value))).status_code
                for name, value in (("own", own), ("other's", other), ("run token", TOKEN))
            }
            models = await client.get(handle.rollout_url("r1") + "/models", headers=auth(own))
            refused = await client.get(handle.rollout_url("r1") + "/models", headers=auth(TOKEN))
    assert answers == {"own": 200, "other's": 401, "run token": 401}
    assert (models.status_code, refused.status_code) == (200, 401)
    usage = handle.ledger.get("r1")
    assert usage is not None and usage.calls == 1
    assert handle.ledger.get("r2") is None

"""The sandbox probe's answer: GET /v1/rollbridge/probe/<nonce> (bridge/probe.py)."""

from __future__ import annotations

import hashlib
import hmac

import httpx
import pytest
import trio

from bridge.probe import ProbeKey, valid_nonce
from tests.bridge.conftest import AUTH, HI, StartBridge


async def test_answer_matches_the_handle_without_a_bearer(
    start_bridge: StartBridge, client: httpx.AsyncClient
) -> None:
    with trio.fail_after(20):
        handle = await start_bridge(model="rollbridge/echo")
        nonce = "0123456789abcdef" * 2
        response = await client.get(f"{handle.base_url}/v1/rollbridge/probe/{nonce}")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("application/json")
        assert response.json() == {"rollbridge_probe": handle.probe_answer(nonce)}
        # Another nonce, another answer; the same nonce, the same answer.
        other = await client.get(f"{handle.base_url}/v1/rollbridge/probe/Zz_-9")
        assert other.json() == {"rollbridge_probe": handle.probe_answer("Zz_-9")}
        assert handle.probe_answer("Zz_-9") != handle.probe_answer(nonce)


async def test_each_bridge_start_has_its_own_key(start_bridge: StartBridge) -> None:
    with trio.fail_after(20):
        one = await start_bridge(model="rollbridge/echo")
        two = await start_bridge(model="rollbridge/echo")
    assert one.probe_answer("abc") != two.probe_answer("abc")


@pytest.mark.parametrize("nonce", ["a" * 129, "not.hex", "a%20b", "%C3%A9t%C3%A9"])
async def test_bad_nonce_is_400(
    start_bridge: StartBridge, client: httpx.AsyncClient, nonce: str
) -> None:
    with trio.fail_after(20):
        handle = await start_bridge(model="rollbridge/echo")
        response = await client.get(f"{handle.base_url}/v1/rollbridge/probe/{nonce}")
    assert response.status_code == 400
    assert response.json() == {"detail": "invalid probe nonce"}


async def test_other_routes_still_need_the_bearer(
    start_bridge: StartBridge, client: httpx.AsyncClient
) -> None:
    with trio.fail_after(20):
        handle = await start_bridge(model="rollbridge/echo", plain_chat_route=True)
        chat = f"{handle.base_url}/v1/rollouts/r1/chat/completions"
        body = {"model": "x", "messages": HI}
        assert (await client.post(chat, json=body)).status_code == 401
        assert (await client.post(chat, json=body, headers=AUTH)).status_code == 200
        for path in ("/v1/models", "/v1/usage"):
            assert (await client.get(handle.base_url + path)).status_code == 401
            assert (await client.get(handle.base_url + path, headers=AUTH)).status_code == 200
        # Only GET answers the probe; the probe path's parent is nothing.
        probe = f"{handle.base_url}/v1/rollbridge/probe/abc"
        assert (await client.post(probe, json={})).status_code == 405
        assert (await client.get(f"{handle.base_url}/v1/rollbridge/probe/")).status_code == 404


def test_probe_key_is_hmac_sha256_of_the_nonce() -> None:
    key = ProbeKey(b"k" * 32)
    expected = hmac.new(b"k" * 32, b"n0nce", hashlib.sha256).hexdigest()
    assert key.answer("n0nce") == expected
    assert valid_nonce("a" * 128) and not valid_nonce("a" * 129) and not valid_nonce("")
    with pytest.raises(ValueError, match="probe nonce"):
        key.answer("a/b")

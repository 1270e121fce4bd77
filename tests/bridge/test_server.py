"""Starting the bridge as a trio service: config validation, bind errors, the handle."""

from __future__ import annotations

import socket

import pytest
import trio

from bridge import BridgeBindError, BridgeConfig, rollout_url, run_bridge
from tests.bridge.conftest import TOKEN, StartBridge


@pytest.mark.parametrize("token", ["", "   "])
def test_empty_token_rejected(token: str) -> None:
    with pytest.raises(ValueError, match="bridge auth_token must be a non-empty string"):
        BridgeConfig(model="rollbridge/echo", token=token)


async def test_bind_failure_raised_before_started(nursery: trio.Nursery) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = BridgeConfig(model="rollbridge/echo", token=TOKEN, port=port)
        with trio.fail_after(10), pytest.raises(BridgeBindError) as info:
            await nursery.start(run_bridge, config)
    assert str(info.value).startswith(f"could not bind the LLM bridge on 127.0.0.1:{port}: ")
    assert isinstance(info.value, OSError)


async def test_handle(start_bridge: StartBridge) -> None:
    with trio.fail_after(10):
        handle = await start_bridge(model="rollbridge/echo")
    assert handle.base_url == f"http://127.0.0.1:{handle.port}"
    assert handle.rollout_url("a b/c") == f"{handle.base_url}/v1/rollouts/a%20b%2Fc"
    assert handle.rollout_url("r", "https://x.trycloudflare.com/") == (
        "https://x.trycloudflare.com/v1/rollouts/r"
    )
    assert not handle.keepalive
    handle.keepalive = True
    assert handle.keepalive
    handle.keepalive = False
    assert not handle.keepalive


def test_rollout_url_is_one_encoded_segment_under_any_base() -> None:
    assert rollout_url("http://127.0.0.1:9", "a b/c") == "http://127.0.0.1:9/v1/rollouts/a%20b%2Fc"
    assert rollout_url("https://x.trycloudflare.com/", "r?#%") == (
        "https://x.trycloudflare.com/v1/rollouts/r%3F%23%25"
    )


def test_import_is_cheap() -> None:
    import subprocess
    import sys

    code = "import sys, bridge, bridge.cli; print(sorted(m for m in ('litellm', 'quart', 'httpx') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

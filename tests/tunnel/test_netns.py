"""A real isolated sandbox: a network namespace that cannot reach this machine's loopback.

From inside the namespace, the rollout's model call (the SDK's ``chat()``, against the real bridge
with the offline echo model) (a) fails against the loopback ``chat_completions_url`` and
(b) succeeds through an advertised base: the fake cloudflared listening on the host side of a veth
pair that this test creates (10.213.x.x/30, addresses that exist only for this test).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable

import httpx
import pytest
import trio

from bridge import OFFLINE_MODEL, BridgeConfig, BridgeHandle, run_bridge
from tests.fakes.cloudflared_support import REPO_ROOT, resolve_public_url
from tests.tunnel.conftest import FakeCloudflared
from tunnel import TunnelHandle, TunnelOptions, run_cloudflared_tunnel

pytestmark = pytest.mark.netns


async def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(15):
        result = await trio.run_process(
            ["ip", *args], capture_stdout=True, capture_stderr=True, check=False
        )
    if check and result.returncode != 0:
        raise AssertionError(f"ip {' '.join(args)} failed: {result.stderr.decode().strip()}")
    return result


async def _pick_subnet() -> tuple[str, str]:
    """A /30 inside 10.213.0.0/16 that no interface on this host uses."""
    used = (await _ip("-4", "-o", "addr", "show")).stdout.decode()
    for _ in range(50):
        base = f"10.213.{secrets.randbelow(256)}.{secrets.randbelow(64) * 4}"
        prefix = base.rsplit(".", 1)[0] + "."
        last = int(base.rsplit(".", 1)[1])
        candidates = [prefix + str(last + i) for i in range(4)]
        if not any(f" {c}/" in used for c in candidates):
            return prefix + str(last + 1), prefix + str(last + 2)
    raise AssertionError("no free 10.213.x.x/30 block found")


async def test_sandbox_reaches_the_bridge_only_through_the_advertised_base(
    nursery: trio.Nursery,
    fake_cloudflared: FakeCloudflared,
    make_options: Callable[..., TunnelOptions],
) -> None:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (this test creates one with iproute2)")
    if shutil.which("ip") is None:
        pytest.skip("iproute2 ('ip') is not installed; .ci/run installs it")
    tag = secrets.token_hex(3)
    namespace = f"rbtest-{os.getpid()}-{tag}"
    host_if, ns_if = f"rbh{tag}", f"rbn{tag}"
    created = await _ip("netns", "add", namespace, check=False)
    if created.returncode != 0:
        pytest.skip(f"cannot create a network namespace here: {created.stderr.decode().strip()}")
    handle: TunnelHandle | None = None
    try:
        host_addr, ns_addr = await _pick_subnet()
        await _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        await _ip("link", "set", ns_if, "netns", namespace)
        await _ip("addr", "add", f"{host_addr}/30", "dev", host_if)
        await _ip("link", "set", host_if, "up")
        await _ip("-n", namespace, "addr", "add", f"{ns_addr}/30", "dev", ns_if)
        await _ip("-n", namespace, "link", "set", ns_if, "up")
        await _ip("-n", namespace, "link", "set", "lo", "up")

        token = secrets.token_hex(16)
        bridge: BridgeHandle = await nursery.start(
            run_bridge, BridgeConfig(model=OFFLINE_MODEL, token=token, keepalive=True)
        )
        fake_cloudflared.knobs(LISTEN=host_addr)
        with trio.fail_after(30):
            handle = await nursery.start(run_cloudflared_tunnel, make_options(bridge.port))
        advertised = resolve_public_url(fake_cloudflared.state, handle.public_url)
        assert advertised.startswith(f"http://{host_addr}:")
        loopback_url = bridge.rollout_url("sandboxed-1")
        public_url = bridge.rollout_url("sandboxed-1", advertised)

        # The loopback URL does work on the host itself: only the sandbox cannot use it.
        with trio.fail_after(10):
            async with httpx.AsyncClient(trust_env=False) as client:
                on_host = await client.post(
                    loopback_url + "/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": "host"}]},
                    headers={"Authorization": f"Bearer {token}"},
                )
        assert on_host.status_code == 200
        bridge.ledger.pop("sandboxed-1")

        with trio.fail_after(40):
            probe = await trio.run_process(
                [
                    "ip",
                    "netns",
                    "exec",
                    namespace,
                    sys.executable,
                    "-m",
                    "tests.tunnel.netns_probe",
                    token,
                    "sandboxed-1",
                    loopback_url,
                    public_url,
                ],
                cwd=REPO_ROOT,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        assert probe.returncode == 0, probe.stderr.decode()
        loopback, through_tunnel = json.loads(probe.stdout)
        assert loopback["error"].startswith("ConnectError"), loopback
        assert through_tunnel.get("reply") == "from the sandbox", through_tunnel
        usage = bridge.ledger.get("sandboxed-1")
        assert usage is not None and usage.total_tokens > 0
    finally:
        with trio.CancelScope(shield=True):
            if handle is not None:
                handle.stop()
                with trio.move_on_after(15):
                    await handle.wait_closed()
            await _ip("link", "del", host_if, check=False)
            await _ip("netns", "del", namespace, check=False)
    listed = (await _ip("netns", "list")).stdout.decode()
    assert namespace not in listed

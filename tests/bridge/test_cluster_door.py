"""The bridge's door on the cluster address (bridge.tls): connections accepted by the
supervisor (peer checked by launcher.cluster.relay.PeerFilter) are handed to the bridge, which
serves them itself over TLS with the run's certificate; a real bridge process and one in this
process, real sockets on port 0, the official OpenAI client pinned to the certificate.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import trio

from bridge.errors import BridgeProcessError
from bridge.process import run_bridge_process
from bridge.server import BridgeConfig, BridgeService, run_bridge
from launcher.cluster.relay import AllowedPeers, pinned_client, serve_relay
from tests.bridge.conftest import TOKEN

openai = pytest.importorskip("openai")

ECHO = "rollbridge/echo"
needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


async def _bridge(nursery: trio.Nursery, in_process: bool) -> BridgeService:
    config = BridgeConfig(model=ECHO, token=TOKEN)
    if in_process:
        handle: BridgeService = await nursery.start(run_bridge, config)
    else:
        handle = await nursery.start(
            lambda task_status: run_bridge_process(
                config, redact_values=(TOKEN,), task_status=task_status
            )
        )
    return handle


async def _door(nursery: trio.Nursery, bridge: BridgeService, refused: list[str]) -> int:
    """The supervisor's side, as launcher.cluster.run opens it: loopback only here."""

    async def hand_over(stream: trio.abc.Stream) -> None:
        assert isinstance(stream, trio.SocketStream)
        await bridge.adopt(socket.socket(fileno=stream.socket.detach()))

    port: int = await nursery.start(
        serve_relay, hand_over, "127.0.0.1", None, AllowedPeers(), refused.append
    )
    return port


def _chat(base: str, verify: ssl.SSLContext | bool, token: str = TOKEN) -> Any:
    http = httpx.Client(verify=verify, timeout=20)
    client = openai.OpenAI(base_url=base, api_key=token, max_retries=0, http_client=http)
    try:
        return client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "over the door"}]
        )
    finally:
        http.close()


def _open_connections(port: int) -> int:
    """This process's TCP connections on the door's port (accepted ones)."""
    return sum(
        1
        for conn in psutil.Process().net_connections("tcp")
        if conn.laddr and conn.laddr.port == port and conn.raddr
    )


@needs_openssl
@pytest.mark.parametrize("in_process", [False, True], ids=["bridge process", "in process"])
async def test_the_bridge_serves_handed_connections_over_tls_with_the_run_certificate(
    in_process: bool,
) -> None:
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            bridge = await _bridge(nursery, in_process)
            pem = await bridge.start_tls("127.0.0.1")
            assert pem is not None and "BEGIN CERTIFICATE" in pem
            port = await _door(nursery, bridge, [])
            base = f"https://127.0.0.1:{port}/v1/rollouts/r1"
            answer = await trio.to_thread.run_sync(_chat, base, pinned_client(pem))
            assert "over the door" in answer.choices[0].message.content
            # The bearer is still checked by the bridge itself.
            with pytest.raises(openai.AuthenticationError):
                await trio.to_thread.run_sync(_chat, base, pinned_client(pem), "wrong-token")
            # A client that does not pin the run's certificate gets no answer.
            with pytest.raises(openai.APIConnectionError):
                await trio.to_thread.run_sync(_chat, base, True)
            # Plain HTTP on the TLS door: the handshake fails, the connection closes, the
            # bridge goes on serving.
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                with pytest.raises(trio.BrokenResourceError):
                    while await stream.receive_some():
                        pass
                    raise trio.BrokenResourceError
            answer = await trio.to_thread.run_sync(_chat, base, pinned_client(pem))
            assert answer.choices[0].message.content
            if not in_process:
                # The supervisor keeps no copy: no byte of the calls crosses it.
                assert _open_connections(port) == 0
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("in_process", [False, True], ids=["bridge process", "in process"])
async def test_without_start_tls_handed_connections_are_plain_http(in_process: bool) -> None:
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            bridge = await _bridge(nursery, in_process)
            port = await _door(nursery, bridge, [])
            async with httpx.AsyncClient(timeout=20) as client:
                for _ in range(3):  # one connection, kept alive across calls
                    answer = await client.post(
                        f"http://127.0.0.1:{port}/v1/rollouts/r1/chat/completions",
                        headers={"Authorization": f"Bearer {TOKEN}"},
                        json={"messages": [{"role": "user", "content": "plain"}]},
                    )
                    assert answer.status_code == 200, answer.text
                refused = await client.post(
                    f"http://127.0.0.1:{port}/v1/rollouts/r1/chat/completions",
                    json={"messages": [{"role": "user", "content": "plain"}]},
                )
                assert refused.status_code == 401
            nursery.cancel_scope.cancel()


async def test_many_connections_handed_at_once_are_each_served() -> None:
    """Each fd crosses with its own line, in order, even when they come together."""
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            bridge = await _bridge(nursery, False)
            port = await _door(nursery, bridge, [])
            statuses: list[int] = []

            async def one(client: httpx.AsyncClient, n: int) -> None:
                answer = await client.post(
                    f"http://127.0.0.1:{port}/v1/rollouts/r{n}/chat/completions",
                    headers={"Authorization": f"Bearer {TOKEN}"},
                    json={"messages": [{"role": "user", "content": f"n{n}"}]},
                )
                statuses.append(answer.status_code)
                assert f"n{n}" in answer.json()["choices"][0]["message"]["content"]

            limits = httpx.Limits(max_connections=100, max_keepalive_connections=0)
            async with (
                httpx.AsyncClient(timeout=30, limits=limits) as client,
                trio.open_nursery() as calls,
            ):
                for n in range(100):
                    calls.start_soon(one, client, n)
            assert statuses == [200] * 100
            nursery.cancel_scope.cancel()


async def _kept_alive(port: int, source: str) -> trio.SocketStream:
    """A connection to the door from ``source`` (a loopback address) that made one call and
    is kept alive."""
    sock = trio.socket.socket()
    await sock.bind((source, 0))
    await sock.connect(("127.0.0.1", port))
    stream = trio.SocketStream(sock)
    await _call_on(stream)
    return stream


async def _call_on(stream: trio.SocketStream) -> None:
    """One kept-alive chat call on ``stream``; raises when the connection is gone."""
    body = b'{"messages":[{"role":"user","content":"kept"}]}'
    await stream.send_all(
        b"POST /v1/rollouts/r1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        + f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n".encode()
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    answer = b""
    while b"kept" not in answer:
        chunk = await stream.receive_some()
        if not chunk:
            raise trio.BrokenResourceError("closed")
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("in_process", [False, True], ids=["bridge process", "in process"])
async def test_cut_closes_the_connections_of_one_peer_and_no_other(in_process: bool) -> None:
    """A node that left the cluster (launcher.cluster.run's poll) keeps no open connection to
    the bridge: ``cut(address)`` closes what that peer had handed over, idle or not, and
    leaves other peers' connections serving. Loopback sources stand in for two nodes."""
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            bridge = await _bridge(nursery, in_process)
            port = await _door(nursery, bridge, [])
            leaving = [await _kept_alive(port, "127.0.0.2") for _ in range(2)]
            staying = await _kept_alive(port, "127.0.0.1")
            assert await bridge.cut("127.0.0.3") == 0
            assert await bridge.cut("::ffff:127.0.0.2") == 2  # any spelling of the address
            for stream in leaving:
                with pytest.raises(trio.BrokenResourceError):
                    await _call_on(stream)  # EOF or a reset, never an answer
            await _call_on(staying)
            assert await bridge.cut("127.0.0.2") == 0  # nothing left of it
            # A peer that was cut may come back (a node rejoining): it is served again.
            back = await _kept_alive(port, "127.0.0.2")
            await _call_on(back)
            for stream in [*leaving, staying, back]:
                await stream.aclose()
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("in_process", [False, True], ids=["bridge process", "in process"])
async def test_a_peer_no_longer_allowed_when_handed_over_is_reset_unserved(
    in_process: bool,
) -> None:
    """The supervisor checks the peer again right as it hands the connection over (the node
    may have left between the accept and the hand-over, and its cut been sent already)."""
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            bridge = await _bridge(nursery, in_process)
            allowed = {"127.0.0.1"}

            async def hand_over(stream: trio.abc.Stream) -> None:
                assert isinstance(stream, trio.SocketStream)
                sock = socket.socket(fileno=stream.socket.detach())
                await bridge.adopt(sock, still_allowed=allowed)

            port = await nursery.start(
                serve_relay, hand_over, "127.0.0.1", None, AllowedPeers(), lambda a: None
            )
            await _call_on(await _kept_alive(port, "127.0.0.1"))
            allowed.clear()
            allowed.add("10.0.0.9")
            with pytest.raises((trio.BrokenResourceError, OSError)):
                await _kept_alive(port, "127.0.0.1")
            nursery.cancel_scope.cancel()


async def _hello(scope: Any, receive: Any, send: Any) -> None:
    """A one-route ASGI app: 200 ``hello``."""
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]}
    )
    await send({"type": "http.response.body", "body": b"hello"})


@needs_openssl
async def test_an_idle_or_silent_tls_connection_is_closed_at_the_idle_timeout() -> None:
    from bridge.tls import ClusterDoor
    from rollout_server.net.leanserve import LeanConfig

    config = LeanConfig()
    config.keep_alive_timeout = 0.5
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            door = ClusterDoor(_hello, config, nursery)
            pem = await door.start_tls("127.0.0.1")
            assert pem is not None
            listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
            port = listener.socket.getsockname()[1]

            async def accept() -> None:
                async with listener:
                    while True:
                        stream = await listener.accept()
                        door.adopt(socket.socket(fileno=stream.socket.detach()))

            nursery.start_soon(accept)
            # A client that never starts the handshake is closed, not kept.
            silent = await trio.open_tcp_stream("127.0.0.1", port)
            async with silent:
                assert await silent.receive_some() == b""
            # One that was answered and then goes quiet is closed too.
            tcp = await trio.open_tcp_stream("127.0.0.1", port)
            client = trio.SSLStream(tcp, pinned_client(pem), server_hostname="127.0.0.1")
            async with client:
                await client.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                answer = b""
                while not answer.endswith(b"hello"):
                    answer += await client.receive_some()
                assert answer.startswith(b"HTTP/1.1 200")
                with pytest.raises(trio.BrokenResourceError):  # closed without close_notify
                    while await client.receive_some():
                        pass
                    raise trio.BrokenResourceError
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("in_process", [False, True], ids=["bridge process", "in process"])
async def test_a_failing_openssl_is_an_error_never_a_fall_back_to_plain_tcp(
    in_process: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "openssl"
    fake.write_text("#!/bin/sh\necho 'no entropy' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            bridge = await _bridge(nursery, in_process)
            expected = subprocess.CalledProcessError if in_process else BridgeProcessError
            with pytest.raises(expected) as caught:
                await bridge.start_tls("127.0.0.1")
            if not in_process:
                assert "could not make the run's TLS certificate" in str(caught.value)
            nursery.cancel_scope.cancel()

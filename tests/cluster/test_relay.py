"""The relays on the bridge's path: bytes both ways, TLS pinned to the run's certificate."""

from __future__ import annotations

import shutil
from functools import partial

import pytest
import trio

from launcher.cluster.relay import pinned_client, relay_to, run_certificate

needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


async def _upper(stream: trio.abc.Stream) -> None:
    """A stand-in for the bridge: answers each chunk in upper case until end of stream."""
    async with stream:
        async for chunk in stream:
            await stream.send_all(chunk.upper())


async def _through(port: int, payload: bytes) -> bytes:
    """Send ``payload``, read as many bytes back (or until end of stream), then close: as an
    HTTP client does, which never half-closes (a TLS hop cannot carry a half-close)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(payload)
        received = b""
        while len(received) < len(payload):
            chunk = await stream.receive_some()
            if not chunk:
                break
            received += chunk
        return received


async def _serve(nursery: trio.Nursery, handler: object) -> int:
    listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    return int(listeners[0].socket.getsockname()[1])


@needs_openssl
async def test_tls_hop_carries_bytes_both_ways() -> None:
    cert = run_certificate("127.0.0.1")
    assert cert is not None and "BEGIN CERTIFICATE" in cert.pem
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            bridge = await _serve(nursery, _upper)
            head = await nursery.start(
                partial(
                    trio.serve_ssl_over_tcp,
                    relay_to("127.0.0.1", bridge),
                    0,
                    cert.server,
                    host="127.0.0.1",
                )
            )
            head_port = int(head[0].transport_listener.socket.getsockname()[1])
            node = await _serve(
                nursery, relay_to("127.0.0.1", head_port, tls=pinned_client(cert.pem))
            )
            assert await _through(node, b"post /v1 hello" * 1000) == b"POST /V1 HELLO" * 1000
            nursery.cancel_scope.cancel()


@needs_openssl
async def test_a_node_pinned_to_another_certificate_gets_nothing_through() -> None:
    cert, other = run_certificate("127.0.0.1"), run_certificate("127.0.0.1")
    assert cert is not None and other is not None
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            reached: list[bytes] = []

            async def bridge_handler(stream: trio.abc.Stream) -> None:
                async with stream:
                    async for chunk in stream:
                        reached.append(chunk)

            bridge = await _serve(nursery, bridge_handler)
            head = await nursery.start(
                partial(
                    trio.serve_ssl_over_tcp,
                    relay_to("127.0.0.1", bridge),
                    0,
                    cert.server,
                    host="127.0.0.1",
                )
            )
            head_port = int(head[0].transport_listener.socket.getsockname()[1])
            node = await _serve(
                nursery, relay_to("127.0.0.1", head_port, tls=pinned_client(other.pem))
            )
            assert await _through(node, b"secret bearer") == b""
            assert reached == []
            nursery.cancel_scope.cancel()

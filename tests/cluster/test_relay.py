"""The relays on the bridge's path: bytes both ways, TLS pinned to the run's certificate."""

from __future__ import annotations

import ipaddress
import shutil
import socket
from functools import partial

import pytest
import trio

from bridge.tls import run_certificate
from launcher.cluster.relay import AllowedPeers, pinned_client, relay_to, serve_relay

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


def _own_address() -> str | None:
    """An address of this machine that is not loopback (the default route's source)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("198.51.100.1", 9))  # no packet is sent: it only picks a route
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if ipaddress.ip_address(address).is_loopback else address


def test_allowed_peers_are_loopback_the_head_and_the_last_nodes_seen() -> None:
    peers = AllowedPeers("10.0.0.1")
    assert "127.0.0.1" in peers and "::1" in peers and "10.0.0.1" in peers
    assert "10.0.0.2" not in peers and "node-name" not in peers
    assert peers.update(["10.0.0.2", "10.0.0.3"]) == frozenset()
    assert "10.0.0.2" in peers and "::ffff:10.0.0.2" in peers
    # What left is told (to cut its connections): never the head or loopback, even if listed.
    assert peers.update(["10.0.0.3", "10.0.0.1", "127.0.0.1"]) == {"10.0.0.2"}
    assert peers.update([]) == {"10.0.0.3"}  # the head and loopback stay allowed
    assert "10.0.0.2" not in peers and "10.0.0.3" not in peers and "10.0.0.1" in peers
    assert 1234 not in peers  # not an address at all


@pytest.mark.parametrize("tls", [False, pytest.param(True, marks=needs_openssl)])
async def test_the_relay_resets_a_peer_outside_the_cluster_without_reading(tls: bool) -> None:
    own = _own_address()
    if own is None:
        pytest.skip("no non-loopback address on this machine")
    cert = run_certificate(own) if tls else None
    peers = AllowedPeers()  # the head is not `own` here: only the nodes' list can admit it
    refused: list[str] = []
    reached: list[bytes] = []

    async def bridge_handler(stream: trio.abc.Stream) -> None:
        async with stream:
            async for chunk in stream:
                reached.append(bytes(chunk))
                await stream.send_all(chunk.upper())

    async def through(port: int) -> bytes:
        try:  # a reset may come as early as the connect
            stream: trio.abc.Stream = await trio.open_tcp_stream(own, port)
            if cert is not None:
                stream = trio.SSLStream(stream, pinned_client(cert.pem), server_hostname=own)
            async with stream:
                await stream.send_all(b"bearer")
                return bytes(await stream.receive_some())
        except (trio.BrokenResourceError, OSError):
            return b""

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            bridge = await _serve(nursery, bridge_handler)
            port = await nursery.start(
                serve_relay,
                relay_to("127.0.0.1", bridge),
                own,
                cert.server if cert is not None else None,
                peers,
                refused.append,
            )
            assert await through(port) == b"" and await through(port) == b""
            assert reached == [] and refused == [own]  # logged once
            peers.update([own])  # the replica manager saw the node alive
            assert await through(port) == b"BEARER"
            peers.update([])  # and then gone
            assert await through(port) == b""
            assert reached == [b"bearer"]
            nursery.cancel_scope.cancel()

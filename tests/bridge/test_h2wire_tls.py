"""bridge.upstreams.h2wire over TLS: ALPN offers h2 and takes it when the server does, and an
origin whose server picks HTTP/1.1 is answered None (the caller's HTTP/1.1 pool takes over)."""

from __future__ import annotations

import ssl
from functools import partial
from pathlib import Path

import pytest
import trio

from bridge.upstreams.h2wire import H2Wire
from rollout_server.net.wire import Origin
from tests.fakes.lean_h2 import H2Answer, serve_h2
from tests.rollout_server.net.test_wire import certificate

__all__ = ["certificate"]  # the fixture, used by name

FIELDS = [(b"content-type", b"application/json")]


async def _tls_server(
    nursery: trio.Nursery, cert: Path, key: Path, alpn: list[str], opened: list[str]
) -> int:
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    server_tls.set_alpn_protocols(alpn)

    async def answer(method: bytes, target: bytes, body: bytes, out: H2Answer) -> None:
        await out.whole(200, b'{"echo": "%s %s %s"}' % (method, target, body))

    async def handler(raw: trio.SocketStream) -> None:
        stream = trio.SSLStream(raw, server_tls, server_side=True)
        try:
            await stream.do_handshake()
            opened.append(stream.selected_alpn_protocol() or "")
            if stream.selected_alpn_protocol() == "h2":
                await serve_h2(stream, b"", answer, max_streams=100)
        except trio.BrokenResourceError:
            return
        finally:
            await trio.aclose_forcefully(stream)

    listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    port: int = listeners[0].socket.getsockname()[1]
    return port


async def _wire(nursery: trio.Nursery) -> H2Wire:
    wire = H2Wire(connect_timeout=10, timeout=10, keepalive_expiry=60)
    await nursery.start(wire.serve)
    return wire


async def test_alpn_h2_is_taken(
    nursery: trio.Nursery, certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = certificate
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    opened: list[str] = []
    port = await _tls_server(nursery, cert, key, ["h2", "http/1.1"], opened)
    wire = await _wire(nursery)
    origin = Origin.parse(f"https://127.0.0.1:{port}/v1/chat/completions")
    with trio.fail_after(20):
        answers = []
        for body in (b"one", b"two"):
            response = await wire.request(origin, FIELDS, body)
            assert response is not None
            answers.append((response.status, await response.read()))
    assert answers == [
        (200, b'{"echo": "POST /v1/chat/completions one"}'),
        (200, b'{"echo": "POST /v1/chat/completions two"}'),
    ]
    assert opened == ["h2"]  # one connection for both calls


async def test_a_server_that_picks_http1_is_left_to_the_http1_pool(
    nursery: trio.Nursery, certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = certificate
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    opened: list[str] = []
    port = await _tls_server(nursery, cert, key, ["http/1.1"], opened)
    wire = await _wire(nursery)
    origin = Origin.parse(f"https://127.0.0.1:{port}/v1/chat/completions")
    with trio.fail_after(20):
        assert await wire.request(origin, FIELDS, b"{}") is None
        assert await wire.request(origin, FIELDS, b"{}") is None
    assert opened == ["http/1.1"]  # remembered: asked once

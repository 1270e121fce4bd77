"""The coalescing hypercorn config: head and body leave in one write, bytes unchanged."""

from __future__ import annotations

import logging
import tomllib
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import hypercorn.trio.run
import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from hypercorn.trio.tcp_server import TCPServer

from rollout_server.net import httpserve
from rollout_server.net.httpclient import skip_empty_cookies
from rollout_server.net.httpserve import (
    TESTED_HYPERCORN,
    CoalescingConfig,
    install_write_coalescing,
)

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _coalescing_installed() -> None:
    # Fails loudly when a hypercorn upgrade moved an internal the patch relies on.
    assert install_write_coalescing(), "write coalescing declined the installed hypercorn"


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    while (await receive()).get("more_body"):
        pass
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for part in (b"one ", b"two ", b"three"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    body = b"" if scope["path"] == "/empty" else b'{"ok":true}'
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if scope["path"] == "/cookie":
        headers.append((b"set-cookie", b"session=abc; Path=/"))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _writes(config: Config, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every write the server makes while answering three requests on one connection."""
    writes: list[bytes] = []
    original = trio.SocketStream.send_all

    async def recording(self: trio.SocketStream, data: Any) -> None:
        writes.append(bytes(data))
        await original(self, data)

    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(serve, _app, config))
            monkeypatch.setattr(trio.SocketStream, "send_all", recording)
            async with httpx.AsyncClient(base_url=binds[0]) as client:
                assert (await client.post("/json", content=b"x")).json() == {"ok": True}
                assert (await client.get("/empty")).content == b""
                assert (await client.get("/stream")).content == b"one two three"
            monkeypatch.setattr(trio.SocketStream, "send_all", original)
            nursery.cancel_scope.cancel()
    # The client's own writes go through the same method; keep the server's.
    return [w for w in writes if w.startswith(b"HTTP/1.1") or not w.startswith((b"POST", b"GET"))]


async def test_head_and_body_leave_in_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    writes = await _writes(CoalescingConfig(), monkeypatch)
    json_write = next(w for w in writes if b"content-type: application/json" in w)
    assert json_write.endswith(b'\r\n\r\n{"ok":true}')
    empty_write = next(w for w in writes if b"content-length: 0" in w)
    assert empty_write.endswith(b"\r\n\r\n")
    stream_head = next(w for w in writes if b"transfer-encoding: chunked" in w.lower())
    # The head rides with the first chunk; later chunks still leave as they are sent.
    assert stream_head.endswith(b"\r\n\r\n4\r\none \r\n")
    assert b"4\r\ntwo \r\n" in writes
    assert b"" not in writes


async def test_plain_config_keeps_hypercorns_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    writes = await _writes(Config(), monkeypatch)
    heads = [w for w in writes if w.startswith(b"HTTP/1.1")]
    assert len(heads) == 3
    assert all(w.endswith(b"\r\n\r\n") for w in heads)


async def _raw_request(stream: trio.SocketStream) -> bytes:
    await stream.send_all(b"GET /json HTTP/1.1\r\nhost: x\r\n\r\n")
    data = b""
    while not data.endswith(b'{"ok":true}'):
        chunk = await stream.receive_some()
        assert chunk, "the server closed the connection mid-response"
        data += chunk
    return data


async def test_idle_connection_closes_after_keep_alive_timeout() -> None:
    config = CoalescingConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.keep_alive_timeout = 0.3
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(serve, _app, config))
            port = int(binds[0].rsplit(":", 1)[1])
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            # Several requests on one connection: each moves the idle deadline on.
            for _ in range(3):
                assert (await _raw_request(stream)).startswith(b"HTTP/1.1 200")
            assert await stream.receive_some() == b""  # closed by the server once idle
            await stream.aclose()
            nursery.cancel_scope.cancel()


async def test_idle_connection_closes_at_shutdown() -> None:
    config = CoalescingConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.graceful_timeout = 60.0  # an idle connection must not hold the shutdown this long
    stop = trio.Event()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(serve, _app, config, shutdown_trigger=stop.wait))
            port = int(binds[0].rsplit(":", 1)[1])
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            assert (await _raw_request(stream)).startswith(b"HTTP/1.1 200")
            stop.set()
            assert await stream.receive_some() == b""
            await stream.aclose()


async def test_skip_empty_cookies_still_keeps_cookies_that_are_set() -> None:
    config = CoalescingConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(serve, _app, config))
            async with skip_empty_cookies(httpx.AsyncClient(base_url=binds[0])) as client:
                await client.get("/json")
                assert dict(client.cookies) == {}
                await client.get("/cookie")
                assert dict(client.cookies) == {"session": "abc"}
                await client.get("/json")
                assert dict(client.cookies) == {"session": "abc"}
            nursery.cancel_scope.cancel()


def test_install_is_explicit_and_idempotent() -> None:
    assert hypercorn.trio.run.TCPServer is not TCPServer
    assert issubclass(hypercorn.trio.run.TCPServer, TCPServer)
    patched = hypercorn.trio.run.TCPServer
    assert install_write_coalescing()
    assert hypercorn.trio.run.TCPServer is patched


def test_pyproject_pins_hypercorn_to_the_tested_range() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (spec,) = [d for d in project["dependencies"] if d.startswith("hypercorn")]
    (low_major, low_minor), (high_major, high_minor) = TESTED_HYPERCORN
    assert spec == f"hypercorn>={low_major}.{low_minor},<{high_major}.{high_minor}"


@pytest.fixture
def unpatched(monkeypatch: pytest.MonkeyPatch) -> None:
    """hypercorn as it is before the install (restored, patched again, after the test)."""
    monkeypatch.setattr(hypercorn.trio.run, "TCPServer", TCPServer)


@pytest.mark.usefixtures("unpatched")
async def test_untested_hypercorn_is_left_alone_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(httpserve, "_installed_hypercorn", lambda: "0.99.0")
    with caplog.at_level(logging.WARNING, logger="rollout_server.net.httpserve"):
        assert not install_write_coalescing()
    assert hypercorn.trio.run.TCPServer is TCPServer
    assert "hypercorn 0.99.0 is installed" in caplog.text
    # A CoalescingConfig then serves exactly as hypercorn does: heads leave on their own.
    writes = await _writes(CoalescingConfig(), monkeypatch)
    heads = [w for w in writes if w.startswith(b"HTTP/1.1")]
    assert len(heads) == 3
    assert all(w.endswith(b"\r\n\r\n") for w in heads)


@pytest.mark.usefixtures("unpatched")
def test_a_moved_internal_is_named_and_the_patch_declined(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delattr(TCPServer, "_initiate_server_close")
    with caplog.at_level(logging.WARNING, logger="rollout_server.net.httpserve"):
        assert not install_write_coalescing()
    assert hypercorn.trio.run.TCPServer is TCPServer
    assert "has no TCPServer._initiate_server_close" in caplog.text
